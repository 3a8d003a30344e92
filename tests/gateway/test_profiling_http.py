"""vLLM's ``/start_profile`` and ``/stop_profile`` over HTTP, on the demo model's engine started with
``--profile-dir``: the trace covers the rounds served between them; the routes take the API key; a round
count (SGLang's ``num_steps``) stops the profile by itself. A gateway whose engine refuses (profiling off)
answers 400 with the engine's reason."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    s = start_serve(tmp, ["--api-key", API_KEY, "--profile-dir", str(tmp / "profiles")])
    try:
        yield s
    finally:
        stop_serve(s)


def _chat(url: str) -> None:
    r = http("POST", url + "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}).encode(),
        {"Content-Type": "application/json", **AUTH})
    assert r.status == 200, r.body


def _rounds(trace: str) -> int:
    events = json.loads(open(trace).read())["traceEvents"]
    return sum(1 for e in events if e.get("name") == "ignis.round")


def test_a_profile_covers_what_was_served(server):
    assert http("POST", server.url + "/start_profile").status == 401  # the API key, as the cache resets
    r = http("POST", server.url + "/start_profile", None, AUTH)  # vLLM's clients send no body
    assert r.status == 200 and r.json() == {"profiling": True}
    again = http("POST", server.url + "/start_profile", None, AUTH)
    assert again.status == 400 and "already profiling" in again.json()["error"]["message"]
    _chat(server.url)
    r = http("POST", server.url + "/stop_profile", None, AUTH)
    assert r.status == 200, r.body
    body = r.json()
    assert body["profiling"] is False and _rounds(body["trace"]) >= 4  # a prefill and three decodes at least
    assert "aten::" in open(body["summary"]).read()
    again = http("POST", server.url + "/stop_profile", None, AUTH)
    assert again.status == 400 and "not profiling" in again.json()["error"]["message"]


def test_num_steps_stops_it_by_itself(server):
    r = http("POST", server.url + "/start_profile", json.dumps({"num_steps": 2}).encode(),
             {"Content-Type": "application/json", **AUTH})
    assert r.status == 200, r.body
    _chat(server.url)
    body = http("POST", server.url + "/stop_profile", None, AUTH).json()
    assert _rounds(body["trace"]) == 2 and "the count the start asked for" in body["message"]
    bad = http("POST", server.url + "/start_profile", json.dumps({"num_steps": 0}).encode(),
               {"Content-Type": "application/json", **AUTH})
    assert bad.status == 400 and "num_steps" in bad.json()["error"]["message"]


def test_an_engine_without_a_profile_dir_says_so_and_bad_bodies_are_named(tmp_path):
    engine = FakeEngine(f"ipc://{tmp_path}/fake-engine.sock")
    proc, url = start_gateway(tmp_path, f"ipc://{tmp_path}/fake-engine.sock")
    try:
        r = http("POST", url + "/start_profile")
        assert r.status == 400 and r.json()["error"]["message"] == (
            "the profiler was not started: profiling is off: start the engine with --profile-dir DIR")
        json_type = {"Content-Type": "application/json"}
        for body, words in ((b"{bad", "JSON"), (b"[]", "object"), (b'{"num_steps": "x"}', "num_steps"),
                            (b'{"num_steps": 2000000}', "num_steps")):
            r = http("POST", url + "/start_profile", body, json_type)
            assert r.status == 400 and words in r.json()["error"]["message"], (body, r.body)
        assert http("POST", url + "/start_profile", b"x", {"Content-Type": "text/plain"}).status == 415
        assert http("GET", url + "/health").status == 200  # and it serves on
    finally:
        stop(proc)
        engine.close()
