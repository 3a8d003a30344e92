"""One stream cannot hold up another: a client that stops reading, and engine messages that are garbage.

A real ``ignis gateway`` process talks to ``bench/null_engine.py`` (the real
ZeroMQ protocol, tokens every round as fast as it can, cycling through the ids
of a known text), which here also sends a malformed TokenBatch after every
third round.
"""

from __future__ import annotations

import fcntl
import json
import socket
import subprocess
import sys
import termios
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.gateway.conftest import http
from tests.gateway.test_engine_errors import start_gateway, stop

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Streams are independent: one slow reader must never hold up another, and garbage is dropped. "
DEADLINE_S = 60  # a failure bound for waits, not a speed requirement


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, demo_tokenizer):
    tmp = tmp_path_factory.mktemp("isolation")
    endpoint = f"ipc://{tmp}/null-engine.sock"
    ids = demo_tokenizer.encode(TEXT)
    engine = subprocess.Popen([sys.executable, str(ROOT / "bench" / "null_engine.py"), "--endpoint", endpoint,
                               "--tokens", ",".join(map(str, ids)), "--garbage-every", "3"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert engine.stdout.readline().startswith("READY"), engine.stdout.read()
    proc, url = start_gateway(tmp, endpoint)
    yield url, ids, tmp / "gw.out"
    stop(proc)
    engine.terminate()
    engine.wait(15)


def stream_text(url: str, max_tokens: int) -> tuple[str, list[str]]:
    """The streamed text of one /v1/completions request, and its SSE data lines."""
    payload = {"prompt": [11, 12, 13], "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    reply = http("POST", url + "/v1/completions", json.dumps(payload).encode(),
                 {"Content-Type": "application/json"}, timeout=DEADLINE_S)
    assert reply.status == 200, reply.body
    lines = [line[6:] for line in reply.body.decode().split("\n") if line.startswith("data: ")]
    text = "".join(c["text"] for line in lines if line != "[DONE]" for c in json.loads(line)["choices"])
    return text, lines


def expected(tok, ids: list[int], n: int) -> str:
    return tok.decode([ids[i % len(ids)] for i in range(n)])


def test_garbage_from_the_engine_is_logged_dropped_and_streams_complete(gateway, demo_tokenizer):
    url, ids, log = gateway
    for n in (5, 3 * len(ids) + 1):
        text, lines = stream_text(url, n)
        assert text == expected(demo_tokenizer, ids, n)
        assert lines[-1] == "[DONE]"
    assert "dropped a malformed message" in log.read_text()
    scrape = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    errors = [line for line in scrape.splitlines() if line.startswith("ignis:gateway_wire_errors_total{")
              and 'socket="engine"' in line]
    assert errors and float(errors[0].rsplit(" ", 1)[1]) > 0, errors


def unread_bytes(sock: socket.socket) -> int:
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), "little")


def test_a_client_that_stops_reading_does_not_hold_up_another_stream(gateway, demo_tokenizer):
    url, ids, _ = gateway
    parsed = urllib.parse.urlparse(url)
    payload = json.dumps({"prompt": [11, 12, 13], "max_tokens": 500_000, "stream": True,
                          "ignore_eos": True}).encode()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # small: its stream backs up in the gateway
    stalled.connect((parsed.hostname, parsed.port))
    try:
        stalled.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json"
                        f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        deadline = time.monotonic() + DEADLINE_S
        while unread_bytes(stalled) < 8192:  # the stalled stream is well under way and nobody reads it
            assert time.monotonic() < deadline, "the stalled stream never started"
            time.sleep(0.01)
        n = 4 * len(ids)
        text, lines = stream_text(url, n)  # completes while the other client reads nothing
        assert text == expected(demo_tokenizer, ids, n)
        assert lines[-1] == "[DONE]"
        head = stalled.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
    finally:
        stalled.close()
    text, _ = stream_text(url, 7)  # the gateway serves on after the stalled client went away
    assert text == expected(demo_tokenizer, ids, 7)
