"""vLLM's ``--speculative-config`` JSON as ignis's speculative flags: MTP and prompt lookup, every key honoured."""

from __future__ import annotations

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.speculative_config import SpeculativeChoice, read_speculative_config


@pytest.mark.parametrize("text, k", [
    ('{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}', 2),
    ('{"method": "mtp", "num_speculative_tokens": 3, "model": null}', 3),
    ('{"num_speculative_tokens": 1, "draft_tensor_parallel_size": 1}', 1),
])
def test_mtp_configs_become_draft_tokens(text, k):
    assert read_speculative_config(text) == SpeculativeChoice("mtp", k)
    cfg = EngineConfig(speculative_config=text)
    assert (cfg.speculative_tokens, cfg.speculative_method) == (k, "mtp")
    assert EngineConfig(speculative_config=text, speculative_tokens=k).speculative_tokens == k


def test_disable_by_batch_size_comes_from_the_flag_or_vllms_key():
    assert EngineConfig(speculative_config='{"method": "mtp", "num_speculative_tokens": 2, '
                                           '"disable_by_batch_size": 8}').speculative_disable_by_batch_size == 8
    assert EngineConfig(speculative_tokens=2, speculative_disable_by_batch_size=4).speculative_disable_by_batch_size == 4
    with pytest.raises(ValueError, match="disable_by_batch_size must be a positive integer"):
        read_speculative_config('{"num_speculative_tokens": 2, "disable_by_batch_size": 0}')


@pytest.mark.parametrize("text, bounds", [
    ('{"method": "ngram", "num_speculative_tokens": 4}', (5, 5)),  # vLLM's defaults
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}', (3, 3)),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}', (2, 2)),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}', (1, 4)),
])
def test_ngram_configs_become_prompt_lookup(text, bounds):
    cfg = EngineConfig(speculative_config=text)
    assert (cfg.speculative_method, cfg.speculative_tokens) == ("ngram", 4)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == bounds
    flags = EngineConfig(speculative_method="ngram", speculative_tokens=4, prompt_lookup_min=bounds[0],
                         prompt_lookup_max=bounds[1])
    assert (flags.prompt_lookup_min, flags.prompt_lookup_max) == bounds


@pytest.mark.parametrize("text, words", [
    ("[]", "must be a JSON object"),
    ('{"method": "eagle3", "num_speculative_tokens": 2}', "method 'eagle3' is not served"),
    ('{"method": "mtp"}', "num_speculative_tokens must be a positive integer, got None"),
    ('{"method": "mtp", "num_speculative_tokens": 0}', "positive integer, got 0"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}',
     "draft_tensor_parallel_size not taken"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "prompt_lookup_max": 3}', "prompt_lookup_max not taken"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}', "prompt_lookup_max must be a "
                                                                                  "positive integer, got 0"),
])
def test_what_ignis_does_not_draft_with_is_refused(text, words):
    with pytest.raises(ValueError, match="--speculative-config") as e:
        read_speculative_config(text)
    assert words in str(e.value)


@pytest.mark.parametrize("kw, words", [
    (dict(speculative_config='{"method": "mtp", "num_speculative_tokens": 17}'),
     "--speculative-tokens must be an integer from 0 to 16"),
    (dict(speculative_config='{"method": "mtp", "num_speculative_tokens": 2}', speculative_tokens=3),
     "asks for 2 draft tokens and --speculative-tokens for 3"),
    (dict(speculative_config='{"method": "mtp", "num_speculative_tokens": 2}', speculative_method="ngram"),
     "asks for method mtp and --speculative-method for ngram"),
    (dict(speculative_config='{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}',
          prompt_lookup_max=4), "asks for prompt_lookup_max 3 and --prompt-lookup-max for 4"),
    (dict(speculative_method="ngram", speculative_tokens=2, prompt_lookup_min=4, prompt_lookup_max=2),
     "--prompt-lookup-min 4 is above --prompt-lookup-max 2"),
    (dict(speculative_method="medusa"), "--speculative-method must be one of mtp, ngram"),
    (dict(speculative_config='{"num_speculative_tokens": 2, "disable_by_batch_size": 8}',
          speculative_disable_by_batch_size=4), "asks for speculative_disable_by_batch_size 8"),
    (dict(speculative_disable_by_batch_size=0), "--speculative-disable-by-batch-size must be a positive integer"),
    (dict(prompt_lookup_min=0), "--prompt-lookup-min must be a positive integer"),
])
def test_contradicting_or_bad_flags_stop_the_config(kw, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**kw)


@pytest.mark.parametrize("kw, want", [
    # the Qwen3.5 model card's SGLang command: a chain of 3 drafts from the checkpoint's head
    (dict(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
          speculative_num_draft_tokens=4), ("mtp", 3, None, None)),
    (dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=3), ("mtp", 2, None, None)),
    (dict(speculative_algorithm="nextn"), ("mtp", 3, None, None)),
    (dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=5), ("ngram", 4, 1, 12)),
    (dict(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=2,
          speculative_ngram_max_match_window_size=4), ("ngram", 4, 2, 4)),
])
def test_sglangs_speculative_flags_become_ignis_choices(kw, want):
    cfg = EngineConfig(**kw)
    assert (cfg.speculative_method, cfg.speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == want


@pytest.mark.parametrize("kw, words", [
    (dict(speculative_algorithm="EAGLE3"), "--speculative-algorithm EAGLE3: not served"),
    (dict(speculative_algorithm="NEXTN", speculative_eagle_topk=4), "--speculative-eagle-topk 4: ignis drafts one "
                                                                    "chain"),
    (dict(speculative_algorithm="NEXTN", speculative_ngram_max_match_window_size=3), "go with --speculative-"
                                                                                       "algorithm NGRAM"),
    (dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=1), "at least 2"),
    (dict(speculative_num_steps=3), "go with --speculative-algorithm"),
    (dict(speculative_algorithm="NEXTN", speculative_config='{"num_speculative_tokens": 2}'), "give one"),
    (dict(speculative_algorithm="NEXTN", speculative_num_steps=2, speculative_tokens=3),
     "--speculative-algorithm asks for 2 draft tokens and --speculative-tokens for 3"),
])
def test_sglang_flags_ignis_would_not_honour_stop_the_config(kw, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**kw)

