"""Test helper: SIGTERM a process back to back, so a second handler interrupts the first."""

from __future__ import annotations

import os
import signal


def sigterm_burst(pid: int, count: int = 2000) -> None:
    for _ in range(count):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return


EXITED_ON_SIGTERM = (0, -signal.SIGTERM)
"""0, or SIGTERM's own exit when a late signal lands after Python restored the default handler at exit."""
