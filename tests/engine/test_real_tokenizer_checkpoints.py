"""The tiny checkpoints with Qwen's real tokenizers: released sizes, small files, loadable by the engine."""

from __future__ import annotations

import json

import pytest

from ignis.engine.models.loader import load_checkpoint
from ignis.shared.tokenizer_files import read_tokenizer_files
from ignis.engine.models.config import load_config
from tests.support.real_tokenizer import FAMILIES, MAX_POSITIONS, TEMPLATE_FILES, token_ids

CONFIG_VOCAB = {"qwen3_5": 248_320, "qwen3_next": 151_936}
SIZE_LIMIT = 100 * 2**20


@pytest.mark.parametrize("family", FAMILIES)
def test_config_has_the_released_sizes(real_checkpoint, family):
    cfg = load_config(real_checkpoint(family).path)
    assert cfg.vocab_size == CONFIG_VOCAB[family]
    assert cfg.max_position_embeddings == MAX_POSITIONS
    assert cfg.tie_word_embeddings
    assert cfg.hidden_size == 64


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_stays_small(real_checkpoint, family):
    path = real_checkpoint(family).path
    total = sum(f.stat().st_size for f in path.iterdir())
    assert total < SIZE_LIMIT, f"{path}: {total / 2**20:.0f} MiB"


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_loads_weights_and_template(real_checkpoint, family):
    path = real_checkpoint(family).path
    loaded = load_checkpoint(path)
    assert loaded.tensors["embed_tokens.weight"].shape == (CONFIG_VOCAB[family], 64)
    assert "lm_head.weight" not in loaded.tensors
    files = read_tokenizer_files(path)
    assert files.chat_template == TEMPLATE_FILES[family].read_text(encoding="utf-8")
    assert files.chat_template_source.endswith("chat_template.jinja")


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_config_stops_on_im_end(real_checkpoint, family):
    path = real_checkpoint(family).path
    gen = json.loads((path / "generation_config.json").read_text())
    ids = token_ids(family)
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]


def test_missing_template_folder_raises_before_building(monkeypatch, tmp_path):
    from tests.support import real_tokenizer

    monkeypatch.setitem(real_tokenizer.TEMPLATE_FILES, "qwen3_5", tmp_path / "absent" / "qwen3_5.jinja")
    with pytest.raises(real_tokenizer.TemplateMissing, match="shared fixtures folder"):
        real_tokenizer.make_real_checkpoint(tmp_path, "qwen3_5")
    assert list(tmp_path.iterdir()) == []
