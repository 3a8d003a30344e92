"""A client that stops reading is bounded: past --stream-buffer-bytes its request is aborted, its lane freed.

A real ``ignis gateway`` process (a small ``--stream-buffer-bytes``) talks to
``bench/null_engine.py`` (the real ZeroMQ protocol, 16 tokens to every stream
every round, as fast as it can). One client opens a long stream
(/v1/completions, then /v1/responses) and never reads; its unwritten output
passes the limit, the gateway aborts the request at the engine (whose
``num_requests_running`` returns to 0), drops the connection, logs it and
counts ``ignis:gateway_stream_stalled_aborts_total``, while another client's
stream completes. Every wait polls against a deadline.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import zmq

from ignis.shared.wire import ENGINE_TO_GATEWAY, Stats, decode, encode
from tests.gateway.conftest import http
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.gateway.test_stream_isolation import expected, stream_text

ROOT = Path(__file__).resolve().parents[2]
TEXT = "=" * 256 + " A reader that stops must not cost the engine a lane, nor the gateway unbounded memory. "
"""Long tokens first (64 characters each in Qwen's vocabulary): the stalled stream fills the kernel's socket
buffers, then the gateway's, in seconds."""
OTHER_TOKENS = 2000
LIMIT = 256 << 10
DEADLINE_S = 60  # a failure bound for waits, not a speed requirement


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, demo_tokenizer):
    tmp = tmp_path_factory.mktemp("stall")
    endpoint = f"ipc://{tmp}/null-engine.sock"
    ids = demo_tokenizer.encode(TEXT)
    engine = subprocess.Popen([sys.executable, str(ROOT / "bench" / "null_engine.py"), "--endpoint", endpoint,
                               "--tokens", ",".join(map(str, ids)), "--burst", "16"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert engine.stdout.readline().startswith("READY"), engine.stdout.read()
    proc, url = start_gateway(tmp, endpoint, "--stream-buffer-bytes", str(LIMIT))
    yield url, endpoint, ids, tmp / "gw.out"
    stop(proc)
    engine.terminate()
    engine.wait(15)


def engine_running(endpoint: str) -> int:
    """The null engine's ``num_requests_running``, asked over its own socket."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode(Stats()))
        assert sock.poll(DEADLINE_S * 1000), "the engine did not answer Stats"
        return int(decode(sock.recv_multipart(), ENGINE_TO_GATEWAY).values["num_requests_running"])
    finally:
        sock.close()


def stalled_aborts(url: str) -> float:
    body = http("GET", url + "/metrics").body.decode()
    found = re.search(r"^ignis:gateway_stream_stalled_aborts_total\{[^}]*\} (\S+)$", body, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for(what: str, check) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.02)


STALLED_REQUESTS = {
    "/v1/completions": {"prompt": [11, 12, 13], "max_tokens": 500_000, "stream": True, "ignore_eos": True},
    "/v1/responses": {"input": "Write on.", "max_output_tokens": 500_000, "stream": True, "store": False},
}


@pytest.mark.parametrize("path", list(STALLED_REQUESTS))
def test_a_stalled_client_is_aborted_and_its_lane_freed_while_others_stream(gateway, demo_tokenizer, path):
    url, endpoint, ids, log = gateway
    before = stalled_aborts(url)
    parsed = urllib.parse.urlparse(url)
    payload = json.dumps(STALLED_REQUESTS[path]).encode()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # small: its output backs up in the gateway
    stalled.connect((parsed.hostname, parsed.port))
    other: dict = {}

    def read_another() -> None:  # streams while the stalled one backs up
        other["result"] = stream_text(url, OTHER_TOKENS)

    try:
        stalled.sendall(f"POST {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json"
                        f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        reader = threading.Thread(target=read_another)
        reader.start()
        wait_for("the stalled stream to be aborted", lambda: stalled_aborts(url) == before + 1)
        reader.join(DEADLINE_S)
        assert not reader.is_alive()
        text, lines = other["result"]
        assert text == expected(demo_tokenizer, ids, OTHER_TOKENS) and lines[-1] == "[DONE]"
        wait_for("the engine to free the lane", lambda: engine_running(endpoint) == 0)
        # the stalled connection was ended: what it holds is finite, then EOF or a reset
        stalled.settimeout(DEADLINE_S)
        received = 0
        try:
            while chunk := stalled.recv(1 << 16):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 64 * LIMIT  # a bound, whatever the kernel buffers held
    finally:
        stalled.close()
    assert "the client stopped reading" in log.read_text()
    text, _ = stream_text(url, 7)  # the gateway serves on
    assert text == expected(demo_tokenizer, ids, 7)
    assert stalled_aborts(url) == before + 1
