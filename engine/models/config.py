"""The model's structural config, read from a checkpoint's config.json (and the end ids its
generation_config.json adds).

One frozen dataclass covers both hybrid families:

- ``qwen3_5``: Qwen3.5 dense (``Qwen3_5ForCausalLM``, or the multimodal
  ``Qwen3_5ForConditionalGeneration`` whose text part sits in ``text_config``);
- ``qwen3_next``: Qwen3-Next MoE (``Qwen3NextForCausalLM``).

Pure Python: no torch import, so ``ignis inspect`` and the planners use it
without loading weights. Sizes derived from the config (KV bytes per token,
recurrent state bytes per sequence) live here too, since every process that
plans memory needs the same numbers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from ignis.engine.models.checkpoint_error import CheckpointError
from ignis.engine.models.fp8_blocks import parse_quantization
from ignis.engine.models.yarn import Yarn, parse_yarn
from ignis.engine.page_pool import PAGE_TOKENS  # noqa: F401 - sizes below are in whole pages

log = logging.getLogger(__name__)

FAMILY_BY_ARCHITECTURE = {
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5TextForCausalLM": "qwen3_5",
    "Qwen3NextForCausalLM": "qwen3_next",
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

KV_FORMATS = ("bf16", "hq-e8-2b")
"""The KV pool's formats (``--kv-format``, less ``auto``)."""

# hq-e8-2b: 2 bits per value (a 16-bit code per 8 values) plus one 16-bit
# scale per 64 values, i.e. 2.25 bits per value.
HQ_E8_2B_BITS_PER_VALUE = 2.25


@dataclass(frozen=True)
class ModelConfig:
    """Structure of one hybrid model, independent of where its weights are."""

    family: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    intermediate_size: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype: str = "float32"
    attention_bias: bool = False
    # YaRN rope scaling (``rope_type: yarn``): None for plain rope; structural when set
    yarn: Yarn | None = None
    # MoE (qwen3_next); num_experts == 0 means dense MLPs everywhere.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    multimodal: bool = False
    # decoder layers of the multi-token-prediction head (``mtp.*``): the config's
    # ``mtp_num_hidden_layers`` (qwen3_5) or ``num_nextn_predict_layers`` (qwen3_next);
    # None when the config does not say (the loader then counts ``mtp.layers.N`` in the files).
    # Not structural: the target model is the same with or without its drafter.
    mtp_layers: int | None = field(default=None, compare=False)
    fp8_block: tuple[int, int] | None = None
    """The weight block size of a block-wise fp8 checkpoint (``engine.models.fp8_blocks``; its weights are
    dequantized at load); None: a float checkpoint. Structural: it joins the structural hash."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # ----- layer bookkeeping -------------------------------------------------
    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    # ----- linear-attention shapes ------------------------------------------
    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v of the linear layers."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    # ----- memory figures ----------------------------------------------------
    def kv_bytes_per_token(self, kv_format: str = "bf16") -> int:
        """Bytes one token's keys and values take in the pool, over all full layers."""
        values = len(self.full_layers) * 2 * self.num_kv_heads * self.head_dim
        if kv_format == "bf16":
            return values * 2
        if kv_format == "hq-e8-2b":
            return int(values * HQ_E8_2B_BITS_PER_VALUE) // 8
        raise ValueError(f"--kv-format: unknown format {kv_format!r} ({', '.join(KV_FORMATS)})")

    def recurrent_state_bytes(self) -> int:
        """fp32 delta-rule state of one sequence over all linear layers."""
        per_layer = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        return len(self.linear_layers) * per_layer * 4

    def conv_state_bytes(self, dtype_bytes: int = 4) -> int:
        """Causal-conv history (kernel-1 columns) of one sequence over all linear layers."""
        return len(self.linear_layers) * self.conv_dim * (self.conv_kernel - 1) * dtype_bytes

    def max_context_for_pool(self, pool_bytes: int, kv_format: str = "bf16") -> int:
        """Largest context (whole pages) that one pool of ``pool_bytes`` holds."""
        per_page = self.kv_bytes_per_token(kv_format) * PAGE_TOKENS
        if per_page == 0:
            return 0
        return (pool_bytes // per_page) * PAGE_TOKENS


FAMILY_DEFAULTS: dict[str, dict] = {
    "qwen3_5": {"vocab_size": 248320, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16,
                "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 12288},
    "qwen3_next": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5632, "num_experts": 512,
                   "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512},
}
"""What a config.json that leaves a field out means: the family's configuration class defaults in transformers
(a checkpoint that loads there loads here; the keys both families default alike are defaulted where read)."""


def _layer_types(text: dict, num_layers: int) -> tuple[str, ...]:
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval", 4))
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    types = tuple(types)
    if len(types) != num_layers:
        raise CheckpointError(
            f"config.json: layer_types has {len(types)} entries for {num_layers} layers"
        )
    for t in types:
        if t not in ("full_attention", "linear_attention"):
            raise CheckpointError(f"config.json: unknown layer type {t!r}")
    return types


def _rope(text: dict) -> tuple[float, float, Yarn | None]:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype not in ("default", "mrope", "yarn"):
        raise CheckpointError(f"config.json: rope type {rtype!r} is not supported (default, mrope and yarn are)")
    yarn = parse_yarn(rope, int(text.get("max_position_embeddings", 32768))) if rtype == "yarn" else None
    return float(theta), float(factor), yarn


def _eos_ids(raw: dict, text: dict) -> tuple[int, ...]:
    eos = text.get("eos_token_id", raw.get("eos_token_id"))
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(e) for e in eos)


def _mtp_layers(text: dict) -> int | None:
    for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        if text.get(key) is not None:
            n = int(text[key])
            if n < 0:
                raise CheckpointError(f"config.json: {key} must be >= 0, got {n}")
            return n
    return None


def config_from_dict(raw: dict) -> ModelConfig:
    """Parse a Hugging Face config.json dict of either family."""
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in FAMILY_BY_ARCHITECTURE), None)
    if arch is None:
        model_type = raw.get("model_type", "")
        by_type = {"qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_text": "Qwen3_5ForCausalLM",
                   "qwen3_next": "Qwen3NextForCausalLM"}
        arch = by_type.get(model_type)
    if arch is None:
        raise CheckpointError(
            f"config.json: unknown architecture {archs or raw.get('model_type')!r}; "
            f"supported: {', '.join(sorted(FAMILY_BY_ARCHITECTURE))}"
        )
    family = FAMILY_BY_ARCHITECTURE[arch]
    multimodal = "text_config" in raw
    text = FAMILY_DEFAULTS[family] | {k: v for k, v in dict(raw.get("text_config") or raw).items() if v is not None}
    try:
        num_layers = int(text["num_hidden_layers"])
        num_heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        head_dim = int(text.get("head_dim") or hidden // num_heads)
        theta, factor, yarn = _rope(text)
        is_moe = family == "qwen3_next" and int(text.get("num_experts", 0)) > 0
        if is_moe and not 1 <= int(text["num_experts_per_tok"]) <= int(text["num_experts"]):
            raise CheckpointError(f"config.json: num_experts_per_tok must be in [1, num_experts="
                                  f"{text['num_experts']}], got {text['num_experts_per_tok']}")
        cfg = ModelConfig(
            family=family,
            architecture=arch,
            vocab_size=int(text["vocab_size"]),
            hidden_size=hidden,
            num_layers=num_layers,
            layer_types=_layer_types(text, num_layers),
            num_heads=num_heads,
            num_kv_heads=int(text.get("num_key_value_heads", num_heads)),
            head_dim=head_dim,
            rotary_dim=int(head_dim * factor),
            rope_theta=theta,
            yarn=yarn,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            intermediate_size=int(text.get("intermediate_size", 0)),
            linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
            tie_word_embeddings=bool(
                raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
            ),
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            dtype=str(text.get("dtype") or text.get("torch_dtype") or raw.get("dtype")
                      or raw.get("torch_dtype") or "float32"),
            attention_bias=bool(text.get("attention_bias", False)),
            num_experts=int(text.get("num_experts", 0)) if is_moe else 0,
            num_experts_per_tok=int(text.get("num_experts_per_tok", 0)) if is_moe else 0,
            moe_intermediate_size=int(text.get("moe_intermediate_size", 0)) if is_moe else 0,
            shared_expert_intermediate_size=(
                int(text.get("shared_expert_intermediate_size", 0)) if is_moe else 0
            ),
            norm_topk_prob=bool(text.get("norm_topk_prob", True)),
            decoder_sparse_step=int(text.get("decoder_sparse_step", 1) or 1),
            mlp_only_layers=tuple(int(i) for i in (text.get("mlp_only_layers") or ())),
            eos_token_ids=_eos_ids(raw, text),
            multimodal=multimodal,
            mtp_layers=_mtp_layers(text),
            fp8_block=parse_quantization(raw, text),
        )
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"config.json: missing or malformed field {exc}") from None
    except CheckpointError:
        raise
    except ValueError as exc:  # a quantization this loader does not take
        raise CheckpointError(f"config.json: {exc}") from None
    if cfg.num_heads % cfg.num_kv_heads:
        raise CheckpointError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise CheckpointError("config.json: linear_num_value_heads must be a multiple of linear_num_key_heads")
    if cfg.dtype not in DTYPE_BYTES:
        raise CheckpointError(f"config.json: unsupported dtype {cfg.dtype!r}")
    return cfg


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read ``config.json`` from a checkpoint directory."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no config.json in the model directory") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    cfg = config_from_dict(raw)
    more = generation_eos_ids(Path(model_dir))
    if any(e not in cfg.eos_token_ids for e in more):
        cfg = replace(cfg, eos_token_ids=tuple(dict.fromkeys(cfg.eos_token_ids + more)))
    return cfg


def generation_eos_ids(model_dir: Path) -> tuple[int, ...]:
    """The end ids ``generation_config.json`` lists (Qwen3.5's: ``<|im_end|>`` and ``<|endoftext|>``, where
    config.json names the first alone); every one ends a choice, as vLLM adds them to its stop ids. A
    missing or unreadable file adds none (the gateway reports a bad file); a malformed entry adds none and is
    named in a warning (the model would not stop where its checkpoint says)."""
    try:
        gen = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return ()
    eos = gen.get("eos_token_id") if isinstance(gen, dict) else None
    ids = [eos] if eos is not None and not isinstance(eos, list) else eos or []
    bad = [e for e in ids if type(e) is not int or e < 0]
    if bad:
        log.warning("%s: eos_token_id entries %s are not token ids (non-negative integers): left out, so the "
                    "model does not stop at them", model_dir / "generation_config.json", bad)
    return tuple(e for e in ids if type(e) is int and e >= 0)
