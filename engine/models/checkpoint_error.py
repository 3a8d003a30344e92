"""``CheckpointError``, a checkpoint that cannot be served, and ``safetensors_file``, which opens one of its
weight files with the read errors named as that (its own module, so every reader of checkpoint files can use
them without importing another's)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; the message names the file or tensor."""


@contextmanager
def safetensors_file(path: Path):
    """``safe_open`` of ``path`` on the CPU; a corrupt or unreadable file, while it is open or read from,
    raises CheckpointError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            yield f
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: corrupt safetensors file ({exc})") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
