"""Process logging: one line per event on stderr, readable in journald.

A fatal signal (SIGABRT from systemd's watchdog or the engine's own, SIGSEGV,
SIGBUS, ...) writes every thread's Python stack to stderr first
(``faulthandler``), so the log says where a stuck or crashed process was.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys


def setup_logging(process: str, level: str | None = None) -> None:
    level = (level or os.environ.get("IGNIS_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {process} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if not faulthandler.is_enabled():  # (a test runner may have it on already, to its own file)
        try:
            faulthandler.enable(file=sys.stderr, all_threads=True)
        except (OSError, ValueError, AttributeError):  # a stderr without a file descriptor
            pass
