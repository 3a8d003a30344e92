"""The name a served model answers to, computed the same way by engine and gateway."""

from __future__ import annotations

from pathlib import Path

DEMO_MODEL_NAME = "ignis-demo"


def served_name(model_dir: str | None, explicit: str | None = None) -> str:
    """``explicit`` if given; the demo's name when no directory is; else the directory's name."""
    if explicit:
        return explicit
    if not model_dir:
        return DEMO_MODEL_NAME
    return Path(model_dir).resolve().name or str(model_dir)
