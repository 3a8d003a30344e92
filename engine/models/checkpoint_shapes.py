"""The config.json values of real checkpoints, for benchmarks and tests that need their shapes without their weights.

``QWEN35_27B`` is Qwen3.5-27B's text model (64 layers, every 4th full
attention; hidden 5120; 24 query / 4 KV heads of 256; Gated DeltaNet 16 key /
48 value heads of 128; MLP 17408; the real vocabulary). ``QWEN3_NEXT_80B`` is
Qwen3-Next-80B-A3B's (48 layers; 512 experts, 10 routed per token). Both go
through ``config_from_dict`` like a checkpoint's own file; a caller overrides
keys (fewer layers, a tiny vocabulary) with ``{**QWEN35_27B, ...}``.
"""

from __future__ import annotations

QWEN35_27B = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "full_attention_interval": 4,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "partial_rotary_factor": 0.25,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "dtype": "bfloat16",
}

QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "intermediate_size": 5120, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
}
