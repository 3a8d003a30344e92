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
    assert first_taken([("--a", "127.0.0.1", 0, False), ("--b", "127.0.0.1", None, True),
                        ("--c", "127.0.0.1", free, False)]) is None
    assert first_taken([("--c", "127.0.0.1", free, False), ("--port", "127.0.0.1", taken_port, False)]).startswith(
        f"--port {taken_port}: cannot listen on 127.0.0.1:{taken_port}")
    assert first_taken([("--port", "127.0.0.1", free, False), ("--metrics-port", "127.0.0.1", free, True)]) == (
        f"--metrics-port {free}: the port --port takes")  # each free alone, not both
    assert "cannot resolve" in bind_problem("no-such-host.invalid", 8000)


def test_a_family_this_machine_lacks_is_skipped(monkeypatch):
    """An IPv6 address on a machine without IPv6: asyncio skips it, so does the check (it raised)."""
    real = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))])
    monkeypatch.setattr(socket, "socket", no_ipv6)
    assert bind_problem("localhost", 0) is None


def test_a_metrics_port_is_checked_as_it_binds_dual_stack():
    """The metrics endpoints bind the first address, IPv6 dual-stack: '::' is taken when 0.0.0.0 is."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::", 0))
            dual = not probe.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    except OSError:
        pytest.skip("no IPv6 here")
    if not dual:
        pytest.skip("IPv6 sockets are IPv6-only here (net.ipv6.bindv6only)")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert bind_problem("::", port, first_only=True) is not None
        assert bind_problem("::", port) is None  # the gateway's IPv6-only bind of '::' would succeed


@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--tierd-metrics-port"])
def test_serve_refuses_a_taken_port_at_once_naming_the_flag(flag, taken_port, tmp_path):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path),
                          flag, str(taken_port)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"ignis serve: {flag} {taken_port}: cannot listen on 127.0.0.1:{taken_port}" in out.stderr
    assert "READY" not in out.stdout and "ignis tierd" not in out.stderr  # nothing was started
    assert time.monotonic() - started < 60
