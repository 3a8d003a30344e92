"""config.json fields left out mean what transformers' configuration classes default them to."""

from __future__ import annotations

import pytest

from ignis.engine.models.config import CheckpointError, config_from_dict

transformers = pytest.importorskip("transformers")

FIELDS = {  # ignis's field: transformers' attribute
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "rms_norm_eps": "rms_norm_eps",
    "linear_num_key_heads": "linear_num_key_heads", "linear_num_value_heads": "linear_num_value_heads",
    "linear_key_head_dim": "linear_key_head_dim", "linear_value_head_dim": "linear_value_head_dim",
    "conv_kernel": "linear_conv_kernel_dim", "max_position_embeddings": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings", "attention_bias": "attention_bias",
}
MOE = {"num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
       "moe_intermediate_size": "moe_intermediate_size",
       "shared_expert_intermediate_size": "shared_expert_intermediate_size", "norm_topk_prob": "norm_topk_prob",
       "decoder_sparse_step": "decoder_sparse_step"}


@pytest.mark.parametrize("arch,model_type,cls,fields", [
    ("Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3_5TextConfig", FIELDS),
    ("Qwen3NextForCausalLM", "qwen3_next", "Qwen3NextConfig", FIELDS | MOE),
])
def test_a_config_that_leaves_fields_out_reads_as_transformers_reads_it(arch, model_type, cls, fields):
    # a Qwen3-Next config.json without num_experts_per_tok read as 0 experts a token and the engine died
    # at warm-up; one without head_dim or num_key_value_heads failed to load on the weights' shapes
    ref = getattr(transformers, cls)()
    cfg = config_from_dict({"architectures": [arch], "model_type": model_type})
    for ours, theirs in fields.items():
        assert getattr(cfg, ours) == getattr(ref, theirs), ours
    assert cfg.rotary_dim == int(ref.head_dim * ref.rope_parameters["partial_rotary_factor"])
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
    assert list(cfg.layer_types) == list(ref.layer_types)


def test_experts_a_token_past_the_experts_is_refused_at_load():
    for k in (0, 9):
        with pytest.raises(CheckpointError, match="num_experts_per_tok"):
            config_from_dict({"architectures": ["Qwen3NextForCausalLM"], "num_experts": 8, "num_experts_per_tok": k})


def test_yarn_is_read_and_is_part_of_the_structure():
    from ignis.engine.models.loader import structural_hash

    base = {"architectures": ["Qwen3_5ForCausalLM"], "max_position_embeddings": 1_010_000}
    card = dict(base, rope_parameters={"rope_type": "yarn", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                       "factor": 4.0, "original_max_position_embeddings": 262144})
    cfg = config_from_dict(card)
    assert cfg.yarn.factor == 4.0 and abs(cfg.yarn.attention_factor - (0.1 * __import__("math").log(4) + 1)) < 1e-12
    plain = config_from_dict(base)
    assert plain.yarn is None and structural_hash(cfg, {}) != structural_hash(plain, {})
    no_original = dict(base, rope_parameters={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(CheckpointError, match="original_max_position_embeddings"):
        config_from_dict(no_original)
    with pytest.raises(CheckpointError, match="not supported"):
        config_from_dict(dict(base, rope_parameters={"rope_type": "longrope"}))
