"""When ``ignis serve`` restarts a child that died while serving: exponential back-off, reset by a stable run.

::

    died -> wait delay -> start -> READY within start_timeout? -- yes --> serving
      ^                              | no (exited, or timed out: killed)      |
      +------ delay doubles ---------+          up for stable_s: delay back to first_s

Pure bookkeeping (no processes, no clock of its own): ``serve`` asks
``delay()`` when a child dies and tells ``started`` / ``ready`` what happened.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBackoff:
    first_s: float = 0.5
    most_s: float = 10.0
    stable_s: float = 60.0
    """A child up this long counts as healthy again: its next death waits ``first_s``."""
    restarts: int = 0
    _next_s: float = 0.0
    _ready_at: float | None = None

    def __post_init__(self):
        if not 0 < self.first_s <= self.most_s:
            raise ValueError(f"back-off must satisfy 0 < first_s <= most_s, got {self.first_s}, {self.most_s}")
        self._next_s = self.first_s

    def ready(self, now: float) -> None:
        """The child (re)started and became ready at ``now``."""
        self._ready_at = now

    def delay(self, now: float) -> float:
        """The child died at ``now``: seconds to wait before starting it again."""
        if self._ready_at is not None and now - self._ready_at >= self.stable_s:
            self._next_s = self.first_s
        self._ready_at = None
        delay, self._next_s = self._next_s, min(self.most_s, self._next_s * 2)
        self.restarts += 1
        return delay
