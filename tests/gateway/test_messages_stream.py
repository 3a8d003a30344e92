"""/v1/messages against the scripted engine: keep-alive pings, refusals before the headers, request ids."""

from __future__ import annotations

from http.client import HTTPConnection
import json
import time
from urllib.parse import urlparse

import pytest

from ignis.gateway.messages_output import PING_S, START_AFTER_S
from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop

anthropic = pytest.importorskip("anthropic")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake-messages")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock")
    yield engine, url
    stop(proc)
    engine.close()


def body(seed=None, stream=False, **kw):
    b = {"max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": "hi"}], **kw}
    if seed is not None:
        b["seed"] = seed
    return b


def post(url, payload, headers=None):
    return http("POST", url + "/v1/messages", json.dumps(payload).encode(),
                {"Content-Type": "application/json", **(headers or {})})


def _events(resp, until: str, deadline_s: float) -> list[tuple[str, dict]]:
    """The stream's (event, data) pairs up to and including the first ``until`` event."""
    out, name, started = [], None, time.monotonic()
    while time.monotonic() - started < deadline_s:
        line = resp.fp.readline().decode()
        if line.startswith("event: "):
            name = line[7:].strip()
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
            if name == until:
                return out
    raise AssertionError(f"no {until} event in {deadline_s} s: {out}")


def _stream(url: str, payload: dict, until: str, deadline_s: float) -> list[tuple[str, dict]]:
    """A streamed /v1/messages turn's (event, data) pairs up to and including the first ``until``."""
    u = urlparse(url)
    conn = HTTPConnection(u.hostname, u.port, timeout=deadline_s)
    try:
        conn.request("POST", "/v1/messages", json.dumps(payload), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        return _events(resp, until, deadline_s)
    finally:
        conn.close()


def test_message_start_reports_the_cached_prompt_the_engine_admitted(fake):
    """The scripted engine admits with one cached token before its first: message_start's usage has the
    split (what Anthropic sends and what clients reading message_start's input count take), and
    message_delta's, from the Finished, agrees."""
    _, url = fake
    events = _stream(url, body(seed=7, stream=True, max_tokens=2), "message_stop", 30)
    start = events[0][1]["message"]["usage"]
    final = next(d for e, d in events if e == "message_delta")["usage"]
    assert start["cache_read_input_tokens"] == 1 and start["input_tokens"] >= 1, start
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (
        final["input_tokens"], final["cache_read_input_tokens"]), (start, final)


def test_an_early_message_start_reports_the_cached_prompt_too(fake):
    """Seed 6: admitted, then no first token: the head and message_start go out early, with the split."""
    _, url = fake
    started = time.monotonic()
    events = _stream(url, body(seed=6, stream=True, max_tokens=5), "message_start", START_AFTER_S + 20)
    assert time.monotonic() - started >= START_AFTER_S - 0.5
    usage = events[-1][1]["message"]["usage"]
    assert usage["cache_read_input_tokens"] == 1 and usage["output_tokens"] == 0, usage


def test_a_held_stream_sends_ping_events(fake):
    """Seed 0: one token, then nothing until aborted; the stream keeps the connection with pings."""
    _, url = fake
    u = urlparse(url)
    conn = HTTPConnection(u.hostname, u.port, timeout=PING_S + 10)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body(seed=0, stream=True, max_tokens=50)),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("request-id")
        started, events = time.monotonic(), []
        while "ping" not in events and time.monotonic() - started < PING_S + 5:
            line = resp.fp.readline().decode()
            if line.startswith("event: "):
                events.append(line[7:].strip())
        assert events[0] == "message_start" and "ping" in events, events
        assert time.monotonic() - started >= PING_S - 1  # not a flood: one per interval
    finally:
        conn.close()


@pytest.mark.parametrize("seed, status, kind", [(1, 429, "rate_limit_error"), (2, 400, "invalid_request_error")])
def test_a_refused_stream_still_answers_its_http_status(fake, seed, status, kind):
    _, url = fake
    r = post(url, body(seed=seed, stream=True))
    assert r.status == status, r.body
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind
    assert err["request_id"] == r.headers["request-id"] == r.headers["X-Request-Id"]


def test_every_messages_answer_names_its_request_id(fake):
    _, url = fake
    bad = post(url, {"messages": [{"role": "user", "content": "x"}]})  # no max_tokens
    assert bad.status == 400
    assert bad.json()["request_id"] == bad.headers["request-id"] == bad.headers["X-Request-Id"]
    ok = post(url, body(max_tokens=2))
    assert ok.status == 200 and ok.headers["request-id"] == ok.headers["X-Request-Id"] == ok.json()["id"]
    named = post(url, body(max_tokens=2), {"X-Request-Id": "trace-42"})
    assert named.headers["request-id"] == named.headers["X-Request-Id"] == "trace-42"
    counted = http("POST", url + "/v1/messages/count_tokens", json.dumps(body()).encode(),
                   {"Content-Type": "application/json"})
    assert counted.status == 200 and counted.headers["request-id"]
    nowhere = http("POST", url + "/v1/messages/nope", json.dumps(body()).encode(), {"Content-Type": "application/json"})
    assert nowhere.status == 404 and nowhere.json()["request_id"] == nowhere.headers["request-id"]


def test_the_sdk_reads_the_request_id_of_an_error(fake):
    _, url = fake
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30) as claude:
        with pytest.raises(anthropic.RateLimitError) as caught:
            claude.messages.create(model="ignis-demo", max_tokens=3, messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"seed": 1})
        assert caught.value.request_id and caught.value.request_id.startswith("msg_")
        m = claude.messages.with_raw_response.create(model="ignis-demo", max_tokens=2,
                                                     messages=[{"role": "user", "content": "hi"}])
        assert m.request_id == m.parse().id
