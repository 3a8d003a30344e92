"""systemd notify datagrams: unit level, and from a real engine process."""

from __future__ import annotations

import os
import socket
import time

import pytest

from ignis.shared import sdnotify


def receiver(path_or_abstract: str):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if path_or_abstract.startswith("@"):
        sock.bind(b"\0" + path_or_abstract[1:].encode())
    else:
        sock.bind(path_or_abstract)
    sock.settimeout(5)
    return sock


@pytest.mark.parametrize("abstract", [False, True])
def test_messages_reach_the_socket(tmp_path, monkeypatch, abstract):
    name = f"@ignis-test-{os.getpid()}-{time.monotonic_ns()}" if abstract else str(tmp_path / "notify.sock")
    sock = receiver(name)
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    try:
        assert sdnotify.ready("serving x")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving x"
        assert sdnotify.extend_timeout(1.5)
        assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=1500000"
        assert sdnotify.status("loading")
        assert sock.recv(4096) == b"STATUS=loading"
    finally:
        sock.close()


def test_no_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False


def test_watchdog_interval(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 1.0
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert sdnotify.watchdog_interval() is None


def test_engine_sends_ready_and_watchdog_pings(tmp_path):
    from tests.engine.engine_process import EngineProcess

    path = str(tmp_path / "n.sock")
    sock = receiver(path)
    eng = EngineProcess(tmp_path, "--kv-pool-tokens", "2048", "--decode-lanes", "2",
                        env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    try:
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (any(m.startswith("READY=1") for m in seen)
                                                   and seen.count("WATCHDOG=1") >= 2):
            seen.append(sock.recv(4096).decode())
        assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in seen)
        assert any(m.startswith("READY=1") for m in seen)
        assert seen.count("WATCHDOG=1") >= 2
    finally:
        assert eng.stop() == 0
        sock.close()


@pytest.mark.parametrize("command,extra", [
    ("tierd", ["--reuse-kv-host-pool-bytes", "4M"]),
    ("gateway", ["--port", "0", "--engine-endpoint", "ipc:///tmp/ignis-nobody.sock"]),
])
def test_tierd_and_gateway_send_ready_and_watchdog_pings(tmp_path, command, extra):
    import subprocess
    import sys

    path = str(tmp_path / "n.sock")
    sock = receiver(path)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", command, "--runtime-dir", str(tmp_path / "rt"),
                             *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (any(m.startswith("READY=1") for m in seen)
                                                   and seen.count("WATCHDOG=1") >= 2):
            try:
                seen.append(sock.recv(4096).decode())
            except TimeoutError:
                break
        assert any(m.startswith("READY=1") for m in seen), (seen, proc.poll())
        assert seen.count("WATCHDOG=1") >= 2
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        sock.close()


def test_loop_beat_is_alive_only_while_its_loop_turns():
    import asyncio
    import threading

    async def scenario():
        beat = sdnotify.LoopBeat(asyncio.get_running_loop(), every_s=0.01, stall_s=0.2)
        await asyncio.sleep(0.05)
        assert beat.alive()
        seen = []
        checker = threading.Thread(target=lambda: (time.sleep(0.4), seen.append(beat.alive())))
        checker.start()
        time.sleep(0.6)  # the loop is stuck in this call: no beat for 0.6 s
        checker.join()
        assert seen == [False]
        await asyncio.sleep(0.05)
        assert beat.alive()  # turning again
        return beat

    beat = asyncio.run(scenario())
    assert not beat.alive()  # a closed loop is not alive


def test_tierd_is_alive_only_while_its_loop_turns():
    from types import SimpleNamespace

    from ignis.tierd.server import TierServer

    now = time.monotonic()
    assert TierServer.alive(SimpleNamespace(_last_turn=now))
    assert not TierServer.alive(SimpleNamespace(_last_turn=now - sdnotify.STALL_S - 1))
