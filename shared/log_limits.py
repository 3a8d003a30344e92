"""Bounded log volume: a warning that a peer can trigger at will is logged at most a few times a second.

``RateLimitedLog(log, per_s, burst)`` lets ``burst`` lines through at once,
then ``per_s`` a second; lines held back are counted, and the next line that
passes says how many were suppressed since the last one. Garbage on a socket
thus costs a counter increment, not a line per frame.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable


class RateLimitedLog:
    def __init__(self, log: logging.Logger, per_s: float = 1.0, burst: int = 10,
                 clock: Callable[[], float] = time.monotonic):
        self.log = log
        self.per_s = per_s
        self.burst = burst
        self.clock = clock
        self.suppressed = 0
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def _admit(self) -> int | None:
        """None when the line is held back; else the count suppressed before it."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_s)
            self._last = now
            if self._tokens < 1.0:
                self.suppressed += 1
                return None
            self._tokens -= 1.0
            held, self.suppressed = self.suppressed, 0
            return held

    def warning(self, msg: str, *args) -> bool:
        """Log ``msg % args`` at WARNING if the budget allows; True when it was logged."""
        held = self._admit()
        if held is None:
            return False
        if held:
            msg += " (%d similar lines suppressed)"
            args = (*args, held)
        self.log.warning(msg, *args)
        return True
