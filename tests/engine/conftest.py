"""Session-scoped tiny checkpoints of both families for the engine tests.

``checkpoint_factory(family, **kwargs)`` builds a checkpoint once per distinct
set of arguments (see ``tests.engine.checkpoints.make_checkpoint``) and hands
the same directory to every test that asks for it: tests that damage a
checkpoint must copy it first (``copy_checkpoint``).
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

from tests.engine.checkpoints import FAMILIES, Checkpoint, make_checkpoint


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    cache: dict[tuple, Checkpoint] = {}

    def get(family: str, **kwargs) -> Checkpoint:
        bound = inspect.signature(make_checkpoint).bind(root, family, **kwargs)
        bound.apply_defaults()
        key = repr(sorted((k, v) for k, v in bound.arguments.items() if k != "tmpdir"))
        if key not in cache:
            cache[key] = make_checkpoint(root, family, **kwargs)
        return cache[key]

    return get


@pytest.fixture(scope="session", params=FAMILIES)
def text_checkpoint(request, checkpoint_factory) -> Checkpoint:
    """A text-only single-file checkpoint of each family."""
    return checkpoint_factory(request.param)


@pytest.fixture(scope="session")
def qwen35_checkpoint(checkpoint_factory) -> Checkpoint:
    return checkpoint_factory("qwen3_5")


@pytest.fixture(scope="session")
def qwen3_next_checkpoint(checkpoint_factory) -> Checkpoint:
    return checkpoint_factory("qwen3_next")


@pytest.fixture(scope="session")
def multimodal_checkpoint(checkpoint_factory) -> Checkpoint:
    """Qwen3_5ForConditionalGeneration layout with a tiny vision tower and fake MTP weights."""
    return checkpoint_factory("qwen3_5", multimodal=True, mtp=True)


@pytest.fixture
def copy_checkpoint(tmp_path):
    """Copy a checkpoint directory into this test's tmp dir so it can be damaged."""

    def copy(src: Path) -> Path:
        dst = tmp_path / Path(src).name
        shutil.copytree(src, dst)
        return dst

    return copy
