"""systemd's notify protocol without libsystemd: datagrams to ``$NOTIFY_SOCKET``.

Each process calls ``ready()`` once it serves (Type=notify units), ``status()``
with a one-line state, ``extend_timeout()`` while a model loads, and runs a
``Watchdog`` thread when the unit sets ``WatchdogSec`` (``$WATCHDOG_USEC``),
which pings only while the process's loop turns: the engine's and tierd's
loops note each turn, an asyncio loop (the gateway's) beats through
``LoopBeat``; a loop stuck for ``STALL_S`` stops the pings, and systemd
aborts the process at ``WatchdogSec``.
Abstract socket names (``@...``) are supported. Outside systemd (no
``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

STALL_S = 15.0
"""A loop that has not turned for this long is stuck: the watchdog stops pinging (units set WatchdogSec 30 or
more)."""


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


class LoopBeat:
    """An asyncio loop's heartbeat: a callback every ``every_s`` notes the time; ``alive()`` (from any thread)
    says whether the loop ran it within ``STALL_S``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every_s: float = 1.0, stall_s: float = STALL_S):
        self.loop, self.every_s, self.stall_s = loop, every_s, stall_s
        self.last = time.monotonic()
        loop.call_soon(self._beat)

    def _beat(self) -> None:
        self.last = time.monotonic()
        self.loop.call_later(self.every_s, self._beat)

    def stall(self) -> float:
        """Seconds since the loop last ran the beat (less the beat's own period)."""
        return max(0.0, time.monotonic() - self.last - self.every_s)

    def alive(self) -> bool:
        return not self.loop.is_closed() and time.monotonic() - self.last < self.stall_s
