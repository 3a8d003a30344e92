"""Checkpoints named by a Hugging Face repo id, found in the local Hugging Face cache; nothing is downloaded.

``vllm serve Qwen/Qwen3.5-27B`` fetches the model from the hub. ignis never
downloads at run time, but a model already fetched (``hf download
Qwen/Qwen3.5-27B``, or any hub client, into the standard cache) is served by
its repo id: ``--model Qwen/Qwen3.5-27B`` (or ``NAME=Qwen/Qwen3.5-27B``, or a
``--lora-modules`` path) names the cached snapshot, and the model answers to
the repo id, as vLLM's does. A directory of that name, when one exists, wins.

The cache is ``--download-dir`` (vLLM's flag), else ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub`` (the
hub library's order). A repo's snapshot is the one its ``refs/main`` names,
else its only (or newest) one. A repo id with no cached snapshot is an error
that says where ignis looked and how to fetch it. Pure Python.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_chosen: Path | None = None


def use_cache_dir(path: str | None) -> None:
    """``--download-dir`` (vLLM's flag): look for repo ids there, in the hub's layout, before the environment."""
    global _chosen
    _chosen = Path(path).expanduser() if path else None


def cache_root() -> Path:
    """The hub cache directory: ``--download-dir``, else as the hub library finds it."""
    if _chosen is not None:
        return _chosen
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def is_repo_id(value: str) -> bool:
    """``value`` reads as ORG/NAME and is not a directory here."""
    return bool(REPO_ID.fullmatch(value)) and not Path(value).exists()


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot directory of model ``repo_id`` (None: not in the cache)."""
    repo = cache_root() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        named = snapshots / ref.read_text().strip()
        if named.is_dir():
            return named
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def resolve_checkpoint(value: str, flag: str) -> tuple[str, bool]:
    """``value`` as a directory to read: itself, or a repo id's cached snapshot; and whether it was the
    latter. A repo id not in the cache raises ValueError naming ``flag``."""
    if not is_repo_id(value):
        return value, False
    snapshot = cached_snapshot(value)
    if snapshot is None:
        raise ValueError(f"{flag} {value}: no such directory, and no copy of the Hugging Face model {value} in "
                         f"{cache_root()} (ignis downloads nothing: fetch it first, e.g. 'hf download {value}', "
                         f"or give the checkpoint's directory)")
    return str(snapshot), True
