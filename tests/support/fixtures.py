"""Session fixtures for checkpoints with Qwen's real tokenizers (registered in tests/conftest.py).

``real_tokenizer_dir(family)``: a directory with the family's
``tokenizer.json`` and ``tokenizer_config.json`` (no weights, no template).
``real_checkpoint(family, **kwargs)``: a tiny random checkpoint with the real
tokenizer and chat template (see ``tests.support.real_tokenizer``); the test
skips when the qwen3_5 template is not beside the checkout. Both build each
directory once per session and hand the same one to every test: copy before
damaging it.
"""

from __future__ import annotations

import pytest

from tests.engine.checkpoints import Checkpoint
from tests.support.real_tokenizer import TemplateMissing, make_real_checkpoint, write_real_tokenizer


@pytest.fixture(scope="session")
def real_tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-tokenizers")
    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = write_real_tokenizer(root / family, family)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def real_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-checkpoints")
    cache: dict[tuple, Checkpoint] = {}

    def get(family: str, **kwargs) -> Checkpoint:
        key = (family, repr(sorted(kwargs.items())))
        if key not in cache:
            try:
                cache[key] = make_real_checkpoint(root, family, **kwargs)
            except TemplateMissing as e:
                pytest.skip(str(e))
        return cache[key]

    return get
