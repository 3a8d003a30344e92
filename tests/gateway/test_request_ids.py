"""A client's request id (gateway.request_ids): ``X-Request-Id`` or ``request_id``, kept end to end.

A gateway in front of a scripted engine: the id names the chat completion
(``chatcmpl-<id>``) and the completion (``cmpl-<id>``), starts the engine's
request ids (unique even when a client repeats an id), and comes back in the
answer's ``X-Request-Id`` header, streamed or whole; the Responses API keeps
its own ids and echoes the header. A malformed id is a 400 naming it.
"""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("request-ids")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock")
    try:
        yield engine, url
    finally:
        stop(proc)
        engine.close()


CHAT = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 2}


def _post(url: str, body: dict, **headers):
    return http("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})


def _header(reply, name="X-Request-Id"):
    return {k.lower(): v for k, v in reply.headers.items()}.get(name.lower())


def test_the_header_names_the_completion_the_engine_request_and_the_answer(gateway):
    engine, url = gateway
    r = _post(url + "/v1/chat/completions", CHAT, **{"X-Request-Id": "trace-42"})
    assert r.status == 200 and r.json()["id"] == "chatcmpl-trace-42" and _header(r) == "trace-42"
    first = engine.generates[-1].id
    r = _post(url + "/v1/chat/completions", CHAT, **{"X-Request-Id": "trace-42"})  # the same id again
    assert r.status == 200 and r.json()["id"] == "chatcmpl-trace-42"
    second = engine.generates[-1].id
    assert first.startswith("chatcmpl-trace-42-") and second.startswith("chatcmpl-trace-42-") and first != second


def test_the_body_field_names_a_completion_and_the_header_wins_over_it(gateway):
    engine, url = gateway
    r = _post(url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "request_id": "body-7"})
    assert r.status == 200 and r.json()["id"] == "cmpl-body-7" and _header(r) == "body-7"
    assert engine.generates[-1].id.startswith("cmpl-body-7-")
    r = _post(url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "request_id": "body-7"},
              **{"X-Request-Id": "head-8"})
    assert r.json()["id"] == "cmpl-head-8" and _header(r) == "head-8"


def test_streamed_chunks_carry_the_id_and_the_header_comes_first(gateway):
    _, url = gateway
    r = _post(url + "/v1/chat/completions", {**CHAT, "stream": True}, **{"X-Request-Id": "stream-1"})
    assert r.status == 200 and _header(r) == "stream-1"
    chunks = [json.loads(line[6:]) for line in r.body.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks and all(c["id"] == "chatcmpl-stream-1" for c in chunks)


def test_without_an_id_the_header_is_the_responses_own(gateway):
    _, url = gateway
    r = _post(url + "/v1/chat/completions", CHAT)
    assert r.status == 200 and _header(r) == r.json()["id"]


def test_the_responses_api_keeps_its_ids_and_echoes_the_header(gateway):
    _, url = gateway
    r = _post(url + "/v1/responses", {"input": "Hello.", "max_output_tokens": 2, "store": False},
              **{"X-Request-Id": "resp-trace"})
    assert r.status == 200, r.body
    assert r.json()["id"] != "resp-trace" and _header(r) == "resp-trace"


@pytest.mark.parametrize("where, value", [("header", "has space"), ("header", "x" * 129),
                                          ("body", ""), ("body", "tab\there"), ("body", 7)])
def test_a_malformed_id_is_a_400_naming_it(gateway, where, value):
    engine, url = gateway
    before = len(engine.generates)
    if where == "header":
        r = _post(url + "/v1/chat/completions", CHAT, **{"X-Request-Id": value})
        name = "X-Request-Id"
    else:
        r = _post(url + "/v1/chat/completions", {**CHAT, "request_id": value})
        name = "request_id"
    assert r.status == 400 and r.json()["error"]["param"] == name, r.body
    assert len(engine.generates) == before
    assert _post(url + "/v1/chat/completions", CHAT).status == 200
