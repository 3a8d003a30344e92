"""Fault-injection switches read from the environment (tests only): a number of seconds or a count.

Each process's hook names its own variable (``IGNIS_TIERD_FAULT_*``,
``IGNIS_ENGINE_FAULT_*``) and warns when it acts; these read the value the
same way everywhere: unset, empty or not a number is off (0), a negative
value is 0.
"""

from __future__ import annotations

import os


def env_seconds(name: str) -> float:
    """``name``'s value as seconds (0.0: off)."""
    try:
        return max(0.0, float(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0.0


def env_count(name: str) -> int:
    """``name``'s value as a count (0: off)."""
    try:
        return max(0, int(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0
