"""Process logging: one line per event on stderr, readable in journald."""

from __future__ import annotations

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
