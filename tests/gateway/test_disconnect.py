"""A client that goes away, streaming or not, ends its engine request and frees its pages.

The engine's own Stats (over a direct DEALER) are polled until nothing runs or
waits and every page not held by retained prefix state is free again.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse

import pytest
import zmq

from ignis.shared.wire import ENGINE_TO_GATEWAY, Stats
from ignis.shared.zmq_queues import connect_dealer

LONG = 6000  # tokens: far longer than the test waits


@pytest.fixture
def engine_stats(server):
    ctx = zmq.Context()
    channel = connect_dealer(ctx, server.engine_endpoint, ENGINE_TO_GATEWAY, name="test").start()

    def get() -> dict:
        channel.send(Stats())
        return channel.get(timeout=5).message.values

    yield get
    channel.close()
    ctx.term()


def idle(stats: dict) -> bool:
    held = stats.get("retained_pages_held", 0)
    return (stats["num_requests_running"] == 0 and stats["num_requests_waiting"] == 0
            and stats["pool_pages_free"] >= stats["pool_pages_total"] - held)


def wait_idle(engine_stats, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = engine_stats()
        if idle(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def open_request(server, payload: dict) -> socket.socket:
    """Send a POST on a raw socket (so the test can drop the connection whenever it likes)."""
    url = urllib.parse.urlparse(server.url)
    raw = json.dumps(payload).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                 f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return sock


def busy(engine_stats, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine_stats()["num_requests_running"] == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)


PAYLOAD = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": LONG,
           "ignore_eos": True, "temperature": 0}


def test_disconnect_mid_stream_aborts(server, engine_stats):
    assert idle(wait_idle(engine_stats, 10))
    sock = open_request(server, dict(PAYLOAD, stream=True))
    got = b""
    while got.count(b"data: ") < 5:
        got += sock.recv(65536)
    assert b"200 OK" in got
    sock.close()
    started = time.monotonic()
    s = wait_idle(engine_stats, 5)
    assert idle(s), s
    assert time.monotonic() - started < 5


def test_disconnect_while_waiting_for_a_whole_body_aborts(server, engine_stats):
    assert idle(wait_idle(engine_stats, 10))
    sock = open_request(server, PAYLOAD)
    busy(engine_stats)
    sock.close()
    s = wait_idle(engine_stats, 5)
    assert idle(s), s
