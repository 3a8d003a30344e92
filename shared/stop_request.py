"""A stop asked for from a signal handler, safe to set there.

A Python signal handler runs on the main thread between two bytecodes,
possibly while that thread is inside ``threading.Event.wait`` holding the
event's internal lock. A handler that calls ``Event.set()`` then waits for a
lock its own thread holds, and the process never stops (SIGTERM ignored in
effect). ``StopRequest.set`` only assigns an attribute, which takes no lock;
the loops that serve until a stop look at it at least every ``POLL_S``.
"""

from __future__ import annotations

import time

POLL_S = 0.05


class StopRequest:
    """``set()`` from anywhere (a signal handler included); ``is_set()`` / ``wait()`` from the loop."""

    def __init__(self) -> None:
        self._requested = False

    def set(self, *_signal_args) -> None:
        """Usable directly as a ``signal.signal`` handler."""
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float) -> bool:
        """Sleep until the stop is requested or ``timeout`` seconds pass; returns ``is_set()``."""
        deadline = time.monotonic() + timeout
        while not self._requested:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
        return self._requested
