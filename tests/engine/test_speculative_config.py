"""vLLM's ``--speculative-config`` JSON as ``--speculative-tokens``: MTP methods only, every key honoured."""

from __future__ import annotations

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.speculative_config import speculative_tokens_of


@pytest.mark.parametrize("text, k", [
    ('{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}', 2),
    ('{"method": "mtp", "num_speculative_tokens": 3, "model": null}', 3),
    ('{"num_speculative_tokens": 1, "draft_tensor_parallel_size": 1}', 1),
])
def test_mtp_configs_become_draft_tokens(text, k):
    assert speculative_tokens_of(text) == k
    assert EngineConfig(speculative_config=text).speculative_tokens == k
    assert EngineConfig(speculative_config=text, speculative_tokens=k).speculative_tokens == k


@pytest.mark.parametrize("text, words", [
    ("[]", "must be a JSON object"),
    ('{"method": "ngram", "num_speculative_tokens": 2}', "method 'ngram' is not served"),
    ('{"method": "mtp"}', "num_speculative_tokens must be a positive integer, got None"),
    ('{"method": "mtp", "num_speculative_tokens": 0}', "positive integer, got 0"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}',
     "draft_tensor_parallel_size not taken"),
])
def test_what_ignis_does_not_draft_with_is_refused(text, words):
    with pytest.raises(ValueError, match="--speculative-config") as e:
        speculative_tokens_of(text)
    assert words in str(e.value)


def test_more_than_ignis_verifies_is_refused_by_the_config():
    with pytest.raises(ValueError, match="--speculative-tokens must be an integer from 0 to 16"):
        EngineConfig(speculative_config='{"method": "mtp", "num_speculative_tokens": 17}')
