"""gpu_check's table and time budget: each section's share, and the lines and failures it reports.

Imported by ``bench/gpu_check.py`` once it has set ``TRITON_INTERPRET`` and called ``use_checkout()``.
"""

from __future__ import annotations

BUDGET_S = {"tests": 210.0, "model": 60.0, "bench": 115.0, "hq": 45.0, "tiers": 20.0}  # 450 s of 480


class Report:
    """Lines of the table and the failures, printed as they come."""

    def __init__(self):
        self.lines: list[str] = []
        self.failures: list[str] = []

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.say(f"FAIL {what}")
