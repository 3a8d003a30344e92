"""Fault: SIGTERM to ``ignis serve`` with streams in flight. The gateway stops taking requests (a new one
is refused: connection refused or HTTP 503), the streams in flight run to their end within the grace
period with the same text as a clean run, and ``serve`` and its three children exit cleanly.

Already covered elsewhere: SIGTERM to an idle ``serve`` stopping every child
(tests/launcher/test_serve.py::test_sigterm_stops_every_child_and_a_dead_child_stops_serve), a burst
of SIGTERMs to the engine (tests/engine/test_engine_signals.py) and to tierd
(tests/tierd/test_tierd_signals.py).
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.launcher.test_serve import gone, start

STREAMS = 3
MAX_TOKENS = 64


@dataclass
class Stream:
    prompt: str
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False  # the [DONE] line arrived
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


def _post(url: str, body: dict, timeout: float) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def _body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {"model": "ignis-demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def _complete(url: str, prompt: str) -> str:
    resp = _post(url, _body(prompt, MAX_TOKENS, False), timeout=120)
    assert resp.status == 200, resp.status
    return json.loads(resp.read())["choices"][0]["text"]


def _read_stream(url: str, s: Stream) -> None:
    try:
        resp = _post(url, _body(s.prompt, MAX_TOKENS, True), timeout=60)
        if resp.status != 200:
            s.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                s.done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                s.error = str(event["error"])
                break
            choice = event["choices"][0]
            s.text.append(choice.get("text") or "")
            s.started.set()
            if choice.get("finish_reason"):
                s.finish_reason = choice["finish_reason"]
    except Exception as e:  # noqa: BLE001 - reported by the test
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.started.set()
        s.ended.set()


def _new_request_refused(url: str, deadline: float) -> str:
    """Send fresh requests until one is refused (the gateway stopped listening, or answers 503)."""
    while time.monotonic() < deadline:
        try:
            resp = _post(url, _body("a late request", 1, False), timeout=5)
        except (ConnectionRefusedError, ConnectionResetError):
            return "connection refused"
        except (http.client.RemoteDisconnected, TimeoutError, OSError):
            return "connection closed"
        resp.read()
        if resp.status == 503:
            return "503"
        assert resp.status == 200, resp.status  # taken before the stop reached the gateway
        time.sleep(0.05)  # poll interval
    raise AssertionError("the gateway still takes new requests after SIGTERM")


@pytest.mark.timeout(240)
def test_sigterm_lets_streams_in_flight_finish_refuses_new_ones_and_every_process_exits_cleanly(tmp_path):
    proc, kids = start(tmp_path)
    err = tmp_path / "serve.err"
    try:
        url = re.search(r"^ignis serving ignis-demo on (http://\S+)$", (tmp_path / "serve.out").read_text(),
                        re.M).group(1)
        prompts = [f"Fault matrix stream {i}: tell me about tiers and disks." for i in range(STREAMS)]
        with ThreadPoolExecutor(STREAMS) as pool:  # the clean run, non-streaming, side by side
            clean = list(pool.map(lambda p: _complete(url, p), prompts))
        streams = [Stream(p) for p in prompts]
        threads = [threading.Thread(target=_read_stream, args=(url, s), daemon=True) for s in streams]
        for t in threads:
            t.start()
        for s in streams:
            assert s.started.wait(60), "a stream did not start"
        assert all(s.error is None for s in streams), [s.error for s in streams]
        assert not all(s.ended.is_set() for s in streams), "every stream ended before SIGTERM: raise MAX_TOKENS"
        proc.send_signal(signal.SIGTERM)
        refused = _new_request_refused(url, time.monotonic() + 20)
        running = sum(not s.ended.is_set() for s in streams)
        assert running >= 1, f"the refusal ({refused}) came only after every stream had ended"
        for s in streams:
            assert s.ended.wait(60), "a stream in flight did not end"
        for s, want in zip(streams, clean):
            assert s.error is None and s.done and s.finish_reason == "length", (s.error, s.finish_reason, refused)
            assert "".join(s.text) == want
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 10
        while not all(gone(k) for k in kids):
            assert time.monotonic() < deadline, "a child outlived serve"
            time.sleep(0.05)
        log = err.read_text()
        assert "did not exit within" not in log and "exited with code" not in log and "Traceback" not in log, log[-3000:]
        for line in ("tierd stopped", "engine stopped", "gateway stopping"):
            assert line in log, (line, log[-3000:])
        # tierd last: the engine's drain may still read its copies
        assert log.index("engine stopped") < log.index("tierd stopped"), log[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
