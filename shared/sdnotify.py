"""systemd's notify protocol without libsystemd: datagrams to ``$NOTIFY_SOCKET``.

Each process calls ``ready()`` once it serves (Type=notify units), ``status()``
with a one-line state, ``extend_timeout()`` while a model loads, and runs a
``Watchdog`` thread when the unit sets ``WatchdogSec`` (``$WATCHDOG_USEC``).
Abstract socket names (``@...``) are supported. Outside systemd (no
``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import threading


def _address() -> str | bytes | None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return None
    if path.startswith("@"):
        return b"\0" + path[1:].encode()
    return path


def notify(message: str) -> bool:
    """Send one notify datagram; returns False when there is no socket or sending fails."""
    addr = _address()
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(message.encode())
        return True
    except OSError:
        return False


def ready(status: str | None = None) -> bool:
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def status(text: str) -> bool:
    return notify(f"STATUS={text}")


def stopping() -> bool:
    return notify("STOPPING=1")


def extend_timeout(seconds: float) -> bool:
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")


def watchdog_interval() -> float | None:
    """Seconds between pings (half of WatchdogSec), or None when no watchdog is set for us."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 1_000_000 / 2)
    except ValueError:
        return None


class Watchdog:
    """Sends WATCHDOG=1 at half the watchdog period while ``alive()`` says the process is healthy."""

    def __init__(self, alive=lambda: True):
        self.interval = watchdog_interval()
        self._alive = alive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        if self.interval is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._alive():
                notify("WATCHDOG=1")
