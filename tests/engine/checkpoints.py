"""Tiny random checkpoints of both families, written with transformers' own save_pretrained.

``make_checkpoint`` builds a ``Qwen3_5ForCausalLM``, ``Qwen3_5ForConditionalGeneration``
(tiny vision tower) or ``Qwen3NextForCausalLM`` with seeded random weights,
saves it as a Hugging Face directory and returns the directory and the model,
so tests can compare the engine against transformers' forward. transformers is
imported only when a checkpoint is built.
"""

from __future__ import annotations

import hashlib

from pathlib import Path
from typing import Any, NamedTuple

FAMILIES = ("qwen3_5", "qwen3_next")

LAYER_PATTERNS = {
    "interval4": ("linear_attention", "linear_attention", "linear_attention", "full_attention"),
    "interval2": ("linear_attention", "full_attention"),
    "all_full": ("full_attention",),
}

TINY_TEXT = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[])
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                   patch_size=4, num_position_embeddings=16)

# A tiny VLM whose image tokens fit the tiny vocabulary and whose rotary spans every mRoPE section
# (rotary_dim 16 -> 8 frequencies: t at 0, 3, 6; h at 1, 4, 7; w at 2, 5).
TINY_VLM_TOKENS = dict(image_token_id=120, video_token_id=121, vision_start_token_id=122, vision_end_token_id=123)
TINY_VLM_ROPE = dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0,
                                          mrope_section=[3, 3, 2], mrope_interleaved=True))

FAKE_MTP = {"mtp.fc.weight": (64, 128), "mtp.norm.weight": (64,)}


class Checkpoint(NamedTuple):
    path: Path
    model: Any


def layer_types(pattern: str, num_layers: int) -> list[str]:
    if pattern not in LAYER_PATTERNS:
        raise ValueError(f"layer_pattern: unknown {pattern!r} ({', '.join(LAYER_PATTERNS)})")
    period = LAYER_PATTERNS[pattern]
    return [period[i % len(period)] for i in range(num_layers)]


def make_checkpoint(tmpdir: str | Path, family: str, layer_pattern: str = "interval4", tie: bool = False,
                    multimodal: bool = False, dtype: str = "float32", *, num_layers: int = 4,
                    max_shard_size: str | None = None, mtp: bool = False, seed: int = 0,
                    config_overrides: dict | None = None, vlm_tokens: bool = False) -> Checkpoint:
    """Build, save and return a tiny random checkpoint in a fresh subdirectory of ``tmpdir``."""
    import torch

    if family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r} ({', '.join(FAMILIES)})")
    if multimodal and family != "qwen3_5":
        raise ValueError("multimodal: only the qwen3_5 family has a multimodal layout")
    text = dict(TINY_TEXT, num_hidden_layers=num_layers, layer_types=layer_types(layer_pattern, num_layers),
                tie_word_embeddings=tie)
    if family == "qwen3_next":
        text.update(TINY_MOE)
    text.update(config_overrides or {})

    torch.manual_seed(seed)
    if vlm_tokens and not multimodal:
        raise ValueError("vlm_tokens: only a multimodal checkpoint has image tokens")
    model = _build(family, multimodal, text, tie, TINY_VLM_TOKENS if vlm_tokens else {})
    model = model.to(getattr(torch, dtype)).eval()

    slug = "-".join([family, layer_pattern, f"L{num_layers}", "tied" if tie else "untied",
                     "mm" if multimodal else "text", dtype, f"shard{max_shard_size}" if max_shard_size else "one",
                     "mtp" if mtp else "nomtp", f"s{seed}"] + (["vlm"] if vlm_tokens else []))
    if config_overrides:
        slug += "-" + hashlib.sha1(repr(sorted(config_overrides.items())).encode()).hexdigest()[:10]
    out = Path(tmpdir) / slug
    out.mkdir(parents=True, exist_ok=False)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    if mtp:
        _add_fake_mtp(out, getattr(torch, dtype))
    return Checkpoint(out, model)


def _build(family: str, multimodal: bool, text: dict, tie: bool, top: dict):
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        return Qwen3NextForCausalLM(Qwen3NextConfig(**text))
    if multimodal:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        cfg = Qwen3_5Config(text_config=text, vision_config=TINY_VISION, tie_word_embeddings=tie, **top)
        return Qwen3_5ForConditionalGeneration(cfg)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))


def _add_fake_mtp(out: Path, dtype) -> None:
    """Add multi-token-prediction weights the way released checkpoints carry them."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    fake = {name: torch.randn(shape).to(dtype) for name, shape in FAKE_MTP.items()}
    single = out / "model.safetensors"
    if single.is_file():
        tensors = load_file(single)
        tensors.update(fake)
        save_file(tensors, single, metadata={"format": "pt"})
        return
    save_file(fake, out / "model-mtp.safetensors", metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({name: "model-mtp.safetensors" for name in fake})
    index_path.write_text(json.dumps(index, indent=2))


def canonical_state_dict(model) -> dict:
    """The model's text parameters under canonical names (experts already stacked in memory)."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    out = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.visual."):
            continue
        if name.startswith("lm_head."):
            if not tied:
                out[name] = tensor
            continue
        for prefix in ("model.language_model.", "model."):
            if name.startswith(prefix):
                out[name[len(prefix):]] = tensor
                break
        else:
            raise ValueError(f"unexpected parameter name {name!r}")
    return out
