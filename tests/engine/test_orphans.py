"""Orphans: a client that disconnects, a gateway that dies or hangs: the engine frees their requests.

A real engine (``--gateway-silence-timeout 1``) and two real gateways; nine
long streams (ignore_eos, thousands of tokens) over raw HTTP sockets. One
client drops its connection: its request ends. One gateway is SIGKILLed: its
four other requests end and the other gateway's four run on. The other
gateway is SIGSTOPped (connected, silent): the engine runs nothing, waits for nothing, and every page not held by retained
prefix state is free. The engine lives on and serves the next request. Engine
Stats are polled over a direct DEALER against deadlines of a few seconds
(detection takes one 50 ms check, or the 1 s silence; the abort lands at the
next round, which a loaded 2-core machine can stretch); the times taken are
printed (about 0.03 s for the first two, 1 s for the hung gateway).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.gateway_watch import CHECK_EVERY_S, GatewayWatch
from ignis.shared.zmq_queues import heartbeat_routing_id
from tests.engine.engine_process import ROOT, EngineProcess

KILLED_STREAMS = 5  # one of them drops its client first
HUNG_STREAMS = 4
LONG = 6000  # tokens: far longer than the test runs
API_KEY = "orphans-key"


class FakeChannel:
    def __init__(self):
        self.last_heard: dict[bytes, float] = {}
        self.unreachable: set[bytes] = set()


def test_watch_rules():
    now = [100.0]
    channel = FakeChannel()
    watch = GatewayWatch(channel, silence_s=1.0, clock=lambda: now[0])
    gw, tool, dead = heartbeat_routing_id(), b"\x00k\x8bEg", heartbeat_routing_id()
    assert gw != dead and gw.startswith(b"hb-")
    channel.last_heard.update({gw: 100.0, tool: 100.0, dead: 100.0})
    channel.unreachable.add(dead)
    assert watch.due() and not watch.due()  # at most every CHECK_EVERY_S
    assert watch.gone([gw, tool, dead]) == [(dead, "its connection is gone")]
    now[0] = 101.5
    assert watch.due()
    assert sorted(watch.gone([gw, tool])) == [(gw, "silent for 1.5s")]  # a tool that never heartbeats is kept
    channel.last_heard[gw] = 101.4
    assert watch.gone([gw, tool]) == []
    off = GatewayWatch(channel, silence_s=0.0, clock=lambda: 1e9)
    assert off.gone([gw, tool, dead]) == [(dead, "its connection is gone")]
    assert CHECK_EVERY_S < 0.5
    with pytest.raises(ValueError, match="--gateway-silence-timeout"):
        EngineConfig(gateway_silence_timeout=-1)


class Gateway:
    def __init__(self, runtime_dir: Path, engine_endpoint: str):
        self.log_path = runtime_dir / "gateway.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0", "--runtime-dir", str(runtime_dir),
             "--engine-endpoint", engine_endpoint, "--api-key", API_KEY],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.url = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.url is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-3000:]}")
            m = re.match(r"READY http://([\d.]+):(\d+)", line)
            if m:
                self.url = (m.group(1), int(m.group(2)))
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("gateway did not become ready")

    def stream(self, n: int) -> socket.socket:
        """A streamed chat completion on a raw socket, so the test can drop it whenever it likes."""
        raw = json.dumps({"messages": [{"role": "user", "content": f"Story number {n}, a long one."}],
                          "max_tokens": LONG, "ignore_eos": True, "temperature": 0, "stream": True}).encode()
        sock = socket.create_connection(self.url, timeout=30)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.url[0]}:{self.url[1]}\r\n"
                     f"Content-Type: application/json\r\nAuthorization: Bearer {API_KEY}\r\n"
                     f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        return sock

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()


def streaming(sock: socket.socket) -> bool:
    """Read the response until its first server-sent event (the socket's 30 s timeout bounds it)."""
    seen = b""
    while b"data:" not in seen:
        chunk = sock.recv(65536)
        if not chunk:
            return False
        seen += chunk
    return True


def wait_for(eng: EngineProcess, check, timeout: float, what: str) -> tuple[dict, float]:
    """Poll the engine's Stats until ``check(stats)``; returns them and the seconds it took."""
    start = time.monotonic()
    while True:
        stats = eng.stats()
        if check(stats):
            return stats, time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout}s: {stats}\n{eng.log_text()}")


def idle(stats: dict) -> bool:
    return (stats["num_requests_running"] == 0 and stats["num_requests_waiting"] == 0
            and stats["pool_pages_free"] >= stats["pool_pages_total"] - stats.get("retained_pages_held", 0))


@pytest.fixture
def engine(tmp_path):
    runtime = Path(f"/tmp/ignis-orph-{os.getpid()}-{tmp_path.name[-6:]}")  # short: ipc paths are limited
    runtime.mkdir(parents=True, exist_ok=True)
    eng = EngineProcess(runtime, "--gateway-silence-timeout", "1", "--decode-lanes", "16", "--kv-pool-tokens",
                        str((KILLED_STREAMS + HUNG_STREAMS) * 8192))
    try:
        yield eng, runtime
        assert eng.stop() == 0
    finally:
        if eng.proc.poll() is None:
            eng.stop()
        shutil.rmtree(runtime, ignore_errors=True)


def test_dropped_client_killed_gateway_and_hung_gateway_free_the_engine(engine):
    eng, runtime = engine
    killed, hung = Gateway(runtime, eng.endpoint), Gateway(runtime, eng.endpoint)
    socks = []
    try:
        socks = [killed.stream(i) for i in range(KILLED_STREAMS)] + [hung.stream(i) for i in range(HUNG_STREAMS)]
        wait_for(eng, lambda s: s["num_requests_running"] == len(socks), 60, "every stream running")
        for sock in socks:  # every stream has sent tokens: the gateways relay them
            assert streaming(sock)

        socks.pop(0).close()  # one client goes away
        _, took = wait_for(eng, lambda s: s["num_requests_running"] == len(socks), 3.0, "the dropped client freed")
        print(f"client disconnect freed its lane in {took:.3f}s")

        killed.proc.kill()
        killed.proc.wait(10)
        stats, took = wait_for(eng, lambda s: s["num_requests_running"] <= HUNG_STREAMS, 3.0,
                               "the killed gateway's requests freed")
        assert stats["num_requests_running"] == HUNG_STREAMS and stats["num_requests_waiting"] == 0
        print(f"gateway kill freed {KILLED_STREAMS - 1} lanes in {took:.3f}s")

        hung.proc.send_signal(signal.SIGSTOP)  # alive, connected, silent
        _, took = wait_for(eng, idle, 4.0, "the hung gateway's requests freed")
        print(f"hung gateway's {HUNG_STREAMS} lanes freed in {took:.3f}s")
        log = eng.log_text()
        assert "(its connection is gone)" in log and "(silent for" in log
    finally:
        for gateway in (killed, hung):
            gateway.stop()
        for sock in socks:
            sock.close()
    after = eng.run("after", list(range(3, 40)), max_tokens=4, ignore_eos=True)  # the engine lives on
    assert after.finished is not None and after.finished.finish_reason == "length" and len(after.tokens) == 4
