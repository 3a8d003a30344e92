"""--max-model-len against the checkpoint's trained positions (``engine.runtime.context_length``)."""

from __future__ import annotations

import pytest

from ignis.engine.runtime import context_length


def test_the_model_context_is_the_default_and_a_shorter_length_is_taken():
    assert context_length(None, 32768, environ={}) == 32768
    assert context_length(4096, 32768, environ={}) == 4096


def test_a_length_past_the_trained_positions_is_refused_unless_allowed(caplog):
    with pytest.raises(ValueError, match="max_position_embeddings .32768.*IGNIS_ALLOW_LONG_MAX_MODEL_LEN=1"):
        context_length(65536, 32768, environ={})
    for name in ("IGNIS_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        caplog.clear()
        assert context_length(65536, 32768, environ={name: "1"}) == 65536
        assert "may be wrong" in caplog.text and name in caplog.text
