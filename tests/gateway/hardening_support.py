"""Helpers of the hardening tests: a real ``ignis gateway`` before a scripted engine, raw sockets, RSS.

``Gateway`` runs the process with the given flags (output in a file, read by
``log()``; ``--shutdown-timeout 5``: a probe's leftover connection cannot hold
the stop past the test's wait; ``--watchdog-timeout 10``: a probe that blocks
the event loop that long aborts the gateway and fails its test); ``fake_gateway`` is a context manager that also runs the
``FakeEngine`` (its context: 4096 tokens, so a body limit of 128 KiB and a
character budget of 32,768).
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
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from ignis.gateway.cli import stop_deadline_s
from tests.gateway.conftest import Reply, http
from tests.gateway.fake_engine import FakeEngine


class Gateway:
    def __init__(self, tmp: Path, endpoint: str, *extra: str, env: dict | None = None, name: str = "gw"):
        self.out = tmp / f"{name}.out"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0", "--engine-endpoint", endpoint,
             "--engine-timeout", "5", "--shutdown-timeout", "5", "--watchdog-timeout", "10", *extra],
            stdout=self.out.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.url = self._wait_ready()
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname, parts.port

    def _wait_ready(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("READY "):
                    return line.split()[1]
            if self.proc.poll() is not None:
                raise AssertionError(f"the gateway exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"the gateway did not start:\n{self.log()}")

    def log(self) -> str:
        return self.out.read_text()

    def rss_kb(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def stop(self) -> int:
        """SIGTERM; the gateway gives what is in flight its --shutdown-timeout (5 s here), then exits: its status
        (1 when its stop got stuck and its stop deadline ended it, the stacks in ``log()``). One still there
        past that is aborted (its stacks in the failure's log)."""
        self.proc.terminate()
        try:
            return self.proc.wait(stop_deadline_s(5) + 10)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to the log
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            raise AssertionError(f"the gateway outlived its stop deadline:\n{self.log()[-6000:]}") from None
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def post(self, path: str, body: bytes | dict, headers: dict | None = None, timeout: float = 30) -> Reply:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return http("POST", self.url + path, raw, {"Content-Type": "application/json", **(headers or {})}, timeout)

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=10)


@contextlib.contextmanager
def fake_gateway(tmp: Path, *extra: str, env: dict | None = None):
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    gw = None
    try:
        gw = Gateway(tmp, f"ipc://{tmp}/fake-engine.sock", *extra, env=env)
        gw.engine = engine
        wait_until(lambda: http("GET", gw.url + "/health", timeout=5).status == 200, 30, "the gateway is not healthy")
        yield gw
    finally:
        if gw is not None and gw.stop() != 0 and "has not stopped" in gw.log():
            warnings.warn(f"the gateway's stop got stuck:\n{gw.log()[-6000:]}", stacklevel=1)
        engine.close()


def gateway_refusal(*flags: str) -> str:
    """Start ``ignis gateway --port 0 FLAGS``, which must stop at start with exit code 2; its stderr."""
    r = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0", *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    return r.stderr


def wait_until(check, timeout: float, what: str, every: float = 0.05):
    """Polls ``check()`` until it is truthy (returned) or ``timeout`` passes (AssertionError ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(every)


def post_head(path: str, host: str, length: int, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def read_status(sock: socket.socket, timeout: float) -> int:
    """The status code of the response on ``sock`` (0: closed before one came)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            return 0
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])


def is_closed(sock: socket.socket) -> bool:
    """The peer closed ``sock`` (EOF or reset); whatever it sent before is drained."""
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
