"""``ignis serve`` finds a taken port before it starts anything (it was found once the model had loaded)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from ignis.launcher.ports import bind_problem, first_taken


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_listening_port_is_taken_and_a_free_one_is_not(taken_port):
    assert "in use" in bind_problem("127.0.0.1", taken_port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert bind_problem("127.0.0.1", free) is None
    assert first_taken([("--a", "127.0.0.1", 0), ("--b", "127.0.0.1", None), ("--c", "127.0.0.1", free)]) is None
    assert first_taken([("--c", "127.0.0.1", free), ("--port", "127.0.0.1", taken_port)]).startswith(
        f"--port {taken_port}: cannot listen on 127.0.0.1:{taken_port}")
    assert "cannot resolve" in bind_problem("no-such-host.invalid", 8000)


@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--tierd-metrics-port"])
def test_serve_refuses_a_taken_port_at_once_naming_the_flag(flag, taken_port, tmp_path):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path),
                          flag, str(taken_port)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"ignis serve: {flag} {taken_port}: cannot listen on 127.0.0.1:{taken_port}" in out.stderr
    assert "READY" not in out.stdout and "ignis tierd" not in out.stderr  # nothing was started
    assert time.monotonic() - started < 60
