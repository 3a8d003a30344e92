"""gpu_check's table: the lines and failures a section reports.

Imported by ``bench/gpu_check.py`` once it has set ``TRITON_INTERPRET`` and called ``use_checkout()``.
"""

from __future__ import annotations

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
