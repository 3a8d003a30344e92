"""Engine refusals, engine failures and a missing engine, as the HTTP client sees them.

A real ``ignis gateway`` process talks to a scripted engine (``fake_engine``),
or to an endpoint where nothing listens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ignis.gateway.cli import stop_deadline_s
from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine


def start_gateway(tmp_path, endpoint: str, *extra: str) -> tuple[subprocess.Popen, str]:
    out = (tmp_path / "gw.out").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0", "--engine-endpoint",
                             endpoint, "--engine-timeout", "2", "--shutdown-timeout", "5", *extra], stdout=out,
                            stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in (tmp_path / "gw.out").read_text().splitlines():
            if line.startswith("READY "):
                proc.out_path = tmp_path / "gw.out"
                return proc, line.split()[1]
        assert proc.poll() is None, (tmp_path / "gw.out").read_text()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the gateway did not start")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM; the gateway must exit 0, within its stop deadline (``--shutdown-timeout 5``: 25 s; what a
    slow stop waits for is in its log after 5 s). One still there is aborted: every thread's stack goes to
    its output, ``gw.out``, and into the failure."""
    proc.terminate()
    try:
        proc.wait(stop_deadline_s(5) + 10)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        raise AssertionError(f"the gateway outlived its stop deadline:\n{proc.out_path.read_text()[-8000:]}") \
            from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, proc.out_path.read_text()[-8000:]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock")
    engine.gateway_proc = proc
    yield engine, url
    stop(proc)
    engine.close()


def chat(url, stream=False, **fields):
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream, **fields}
    return http("POST", url + "/v1/chat/completions", json.dumps(payload).encode(),
                {"Content-Type": "application/json"})


@pytest.mark.parametrize("seed,status,code,retry", [
    (1, 429, "queue_full", True), (2, 400, "context_length_exceeded", False),
    (3, 404, "model_not_found", False), (4, 503, "shutting_down", True)])
@pytest.mark.parametrize("stream", [False, True])
def test_refusals_map_to_statuses(fake, seed, status, code, retry, stream):
    _, url = fake
    r = chat(url, stream=stream, seed=seed)
    assert r.status == status, r.body
    assert r.json()["error"]["code"] == code
    assert ("Retry-After" in r.headers) == retry


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("/v1/completions", {"prompt": "hi"}, "prompt"),
    ("/v1/responses", {"input": "hi"}, "input")])
def test_the_engines_too_long_refusal_names_the_endpoints_prompt_field(fake, path, body, param):
    _, url = fake
    r = http("POST", url + path, json.dumps({**body, "max_tokens": 3, "seed": 2}).encode(),
             {"Content-Type": "application/json"})
    assert r.status == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.body
    assert r.json()["error"]["param"] == param


def test_an_engine_serving_other_models_is_unhealthy_and_logged(fake):
    """A gateway started apart from an engine that serves other models: /health says so (503) and the log
    names the models and the flags to fix (it was 200 and silent, every request a 404)."""
    engine, url = fake
    proc = engine.gateway_proc
    engine.served = ("qwen-27b",)
    try:
        deadline = time.monotonic() + 15
        while (r := http("GET", url + "/health")).status != 503:
            assert time.monotonic() < deadline, r.body
            time.sleep(0.05)
        assert r.json()["engine"] == "serves other models: qwen-27b"
        while "the engine serves qwen-27b, not ignis-demo" not in proc.out_path.read_text():
            assert time.monotonic() < deadline, proc.out_path.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        engine.served = ()
    engine.served = ("qwen-27b", "ignis-demo")
    try:
        deadline = time.monotonic() + 15
        while http("GET", url + "/health").status != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        engine.served = ()


@pytest.mark.parametrize("fields, param", [
    ({"structured_outputs": {"regex": "fakeenginerefuses"}}, "structured_outputs"),
    ({"guided_regex": "fakeenginerefuses"}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"fakeenginerefuses": {"type": "integer"}}}}}}, "response_format")])
def test_a_grammar_the_engine_refuses_names_the_field_that_made_it(fake, fields, param):
    _, url = fake
    r = chat(url, **fields)
    assert r.status == 400, r.body
    assert r.json()["error"]["param"] == param and "does not compile" in r.json()["error"]["message"]


def test_fan_out_refused_aborts_the_other_choices(fake):
    engine, url = fake
    r = chat(url, seed=0, n=2)  # choice i gets seed i: the first is held, the second refused (queue_full)
    assert r.status == 429
    assert wait_abort(engine, engine.generates[-2].id)


def wait_abort(engine, engine_id: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while engine_id not in engine.aborts and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine_id in engine.aborts


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_sends_abort(fake, stream):
    engine, url = fake
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": 0,
                      "stream": stream}).encode()
    n = len(engine.generates)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(raw)}\r\n"
                 f"Content-Type: application/json\r\n\r\n".encode() + raw)
    deadline = time.monotonic() + 5
    while len(engine.generates) == n and time.monotonic() < deadline:
        time.sleep(0.01)
    sock.close()
    assert wait_abort(engine, engine.generates[-1].id)


def test_engine_error_mid_stream_is_an_sse_error_then_done(fake):
    _, url = fake
    r = chat(url, stream=True, seed=5)
    assert r.status == 200
    events = [e for e in r.body.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: "):])["error"]
    assert err["message"] == "scripted failure" and set(err) == {"message", "type", "param", "code"}
    whole = chat(url, seed=5)
    assert whole.status == 500 and whole.json()["error"]["message"] == "scripted failure"


def test_usage_comes_from_the_engine(fake):
    _, url = fake
    r = chat(url, seed=7, max_tokens=4)
    assert r.status == 200
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    assert body["choices"][0]["message"]["content"] == "____"


def test_engine_down_is_503_with_retry_after(tmp_path):
    proc, url = start_gateway(tmp_path, f"ipc://{tmp_path}/nobody-home.sock")
    try:
        t0 = time.monotonic()
        r = chat(url)
        assert r.status == 503 and "Retry-After" in r.headers, r.body
        assert r.json()["error"]["type"] == "service_unavailable_error"
        assert time.monotonic() - t0 < 10
        assert http("GET", url + "/health").status == 503
        assert http("GET", url + "/ping").status == 503
        s = chat(url, stream=True)
        assert s.status == 503
    finally:
        stop(proc)


def test_streams_of_a_restarted_engine_fail_instead_of_hanging(fake):
    import threading

    engine, url = fake
    timer = threading.Timer(0.5, lambda: setattr(engine, "started", engine.started + 1.0))
    timer.start()
    r = chat(url, stream=True, seed=0)  # one token, then the engine "restarts" and forgets it
    timer.join()
    assert r.status == 200
    events = [e for e in r.body.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert "restarted" in json.loads(events[-2][len("data: "):])["error"]["message"]
