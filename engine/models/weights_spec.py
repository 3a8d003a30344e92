"""The weight inventory of a hybrid model: what tensors it has and what a file says it holds.

Three things, all pure Python (no torch), so ``ignis inspect`` can use them on a
checkpoint without reading a single tensor:

- ``expected_tensors(cfg)``: the canonical parameter names and shapes of both
  families. Canonical names are the Hugging Face text-model names without the
  leading ``model.`` (``layers.3.self_attn.q_proj.weight``, ``embed_tokens.weight``,
  ``lm_head.weight``).
- ``classify(name)``: what a name found in a checkpoint file is (a canonical
  tensor, one expert's slice of a stacked MoE tensor, or a tensor set aside).
- ``read_header(path)``: the tensor table of a ``.safetensors`` file, read from
  its JSON header only, with the file's size checked against it.

Layouts the model code relies on (rows of the ``[out, in]`` weight matrices):

    self_attn.q_proj      [heads * head_dim * 2, hidden]  per head: query | output gate
    linear_attn (qwen3_5) in_proj_qkv [q (key_dim) | k (key_dim) | v (value_dim)]
    linear_attn (next)    in_proj_qkvz, grouped by key head g (v_per_k = v_heads / k_heads):
                            [q_g (head_k) | k_g (head_k) | v_g (v_per_k*head_v) | z_g (same)] x k_heads
                          in_proj_ba, grouped the same way: [b_g (v_per_k) | a_g (v_per_k)] x k_heads
    mlp.experts.gate_up_proj [E, 2 * moe_inter, hidden]  rows 0..I-1 gate, I..2I-1 up
    mlp.experts.down_proj    [E, hidden, moe_inter]
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ignis.engine.models.config import DTYPE_BYTES, CheckpointError, ModelConfig

FLOAT32_PARAMS = ("A_log", "dt_bias")
"""Last name components of parameters kept in float32 whatever the load dtype
(the decay ``exp(-exp(A_log) * softplus(a + dt_bias))`` is computed in fp32)."""

SET_ASIDE_PREFIXES = {
    "model.visual.": "vision",
    "visual.": "vision",
    "mtp.": "mtp",
}
"""Name prefixes of weights classified apart from the text model, by kind: the vision tower
(read by ``vision_load``) and the multi-token-prediction head (read as the drafter when asked)."""

# Prefixes under which the text model's weights appear, tried in order.
TEXT_PREFIXES = ("model.language_model.", "model.", "")

_EXPERT_RE = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

# safetensors dtype tag -> bytes per element
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
FLOAT_DTYPES = ("F64", "F32", "BF16", "F16")


def keeps_float32(name: str) -> bool:
    """True for parameters loaded in float32 whatever the chosen dtype."""
    return name.rsplit(".", 1)[-1] in FLOAT32_PARAMS


# ----- expected inventory ----------------------------------------------------
def attention_tensors(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, d = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    out = {
        f"{p}.q_proj.weight": (q_out * 2, h),
        f"{p}.k_proj.weight": (kv_out, h),
        f"{p}.v_proj.weight": (kv_out, h),
        f"{p}.o_proj.weight": (h, q_out),
    }
    if cfg.attention_bias:
        out.update({
            f"{p}.q_proj.bias": (q_out * 2,),
            f"{p}.k_proj.bias": (kv_out,),
            f"{p}.v_proj.bias": (kv_out,),
            f"{p}.o_proj.bias": (h,),
        })
    out[f"{p}.q_norm.weight"] = (d,)
    out[f"{p}.k_norm.weight"] = (d,)
    return out


def _linear_attention(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, kd, vd, vh = cfg.hidden_size, cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
    if cfg.family == "qwen3_next":
        out = {
            f"{p}.in_proj_qkvz.weight": (2 * kd + 2 * vd, h),
            f"{p}.in_proj_ba.weight": (2 * vh, h),
        }
    else:
        out = {
            f"{p}.in_proj_qkv.weight": (2 * kd + vd, h),
            f"{p}.in_proj_z.weight": (vd, h),
            f"{p}.in_proj_b.weight": (vh, h),
            f"{p}.in_proj_a.weight": (vh, h),
        }
    out.update({
        f"{p}.conv1d.weight": (cfg.conv_dim, 1, cfg.conv_kernel),
        f"{p}.dt_bias": (vh,),
        f"{p}.A_log": (vh,),
        f"{p}.norm.weight": (cfg.linear_value_head_dim,),
        f"{p}.out_proj.weight": (h, vd),
    })
    return out


def dense_mlp_tensors(h: int, inter: int, p: str) -> dict[str, tuple[int, ...]]:
    return {
        f"{p}.gate_proj.weight": (inter, h),
        f"{p}.up_proj.weight": (inter, h),
        f"{p}.down_proj.weight": (h, inter),
    }


def moe_mlp_tensors(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, e, i = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    out = {
        f"{p}.gate.weight": (e, h),
        f"{p}.experts.gate_up_proj": (e, 2 * i, h),
        f"{p}.experts.down_proj": (e, h, i),
    }
    out.update(dense_mlp_tensors(h, cfg.shared_expert_intermediate_size, f"{p}.shared_expert"))
    out[f"{p}.shared_expert_gate.weight"] = (1, h)
    return out


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape of every parameter the text model of ``cfg`` has."""
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.vocab_size, h)}
    for n, kind in enumerate(cfg.layer_types):
        p = f"layers.{n}"
        out[f"{p}.input_layernorm.weight"] = (h,)
        if kind == "full_attention":
            out.update(attention_tensors(cfg, f"{p}.self_attn"))
        else:
            out.update(_linear_attention(cfg, f"{p}.linear_attn"))
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
        if cfg.is_moe_layer(n):
            out.update(moe_mlp_tensors(cfg, f"{p}.mlp"))
        else:
            out.update(dense_mlp_tensors(h, cfg.intermediate_size, f"{p}.mlp"))
    out["norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    return out


def expected_weight_bytes(cfg: ModelConfig, dtype: str | None = None) -> int:
    """Bytes of all expected tensors stored at ``dtype`` (default: the config's)."""
    dtype = dtype or cfg.dtype
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: unknown {dtype!r} ({', '.join(DTYPE_BYTES)})")
    return sum(math.prod(s) for s in expected_tensors(cfg).values()) * DTYPE_BYTES[dtype]


# ----- names found in files --------------------------------------------------
@dataclass(frozen=True)
class NameKind:
    """What one checkpoint name is.

    kind: ``"tensor"`` (canonical is a key of ``expected_tensors``, if known),
    ``"expert"`` (one expert's ``part`` of the stacked tensor ``canonical``),
    ``"vision"`` / ``"mtp"`` (set aside; canonical is the file name).
    """

    kind: str
    canonical: str
    expert: int = -1
    part: str = ""


def classify(name: str) -> NameKind:
    """Map a name found in a checkpoint file to what it is (no check against a config)."""
    for prefix, kind in SET_ASIDE_PREFIXES.items():
        if name.startswith(prefix):
            return NameKind(kind, name)
    if name.startswith("lm_head."):
        return NameKind("tensor", name)
    stripped = name
    for prefix in TEXT_PREFIXES:
        if name.startswith(prefix):
            stripped = name[len(prefix):]
            break
    m = _EXPERT_RE.match(stripped)
    return expert_kind(m) if m else NameKind("tensor", stripped)


def expert_kind(m: re.Match) -> NameKind:
    """One expert's part (a match of ``(prefix.experts).(index).(part).weight``) as its stacked tensor's
    piece: gate and up stack into ``gate_up_proj``, down into ``down_proj``."""
    stacked = "gate_up_proj" if m.group(3) != "down_proj" else "down_proj"
    return NameKind("expert", f"{m.group(1)}.{stacked}", int(m.group(2)), m.group(3))


def expert_part_shape(cfg: ModelConfig, part: str) -> tuple[int, int]:
    """Shape of one expert's ``gate_proj`` / ``up_proj`` / ``down_proj`` weight."""
    h, i = cfg.hidden_size, cfg.moe_intermediate_size
    return (h, i) if part == "down_proj" else (i, h)


# ----- safetensors headers ---------------------------------------------------
@dataclass(frozen=True)
class HeaderEntry:
    """One tensor as a safetensors header describes it."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: str | Path) -> dict[str, HeaderEntry]:
    """Read the tensor table of a ``.safetensors`` file without reading any tensor.

    Raises ``CheckpointError`` naming the file when it is missing, truncated or
    its header is malformed (including data offsets past the end of the file).
    """
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(
                    f"{path}: truncated or corrupt safetensors file "
                    f"(header claims {n} bytes, file is {size} bytes)")
            raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: weight file not found") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    try:
        table = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; nesting too deep
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc})") from None
    if not isinstance(table, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_size = size - 8 - n
    out = {}
    for name, info in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(info["dtype"]), tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for {name!r}") from None
        itemsize = SAFETENSORS_DTYPE_BYTES.get(dtype)
        if itemsize is not None and end - begin != math.prod(shape) * itemsize:
            raise CheckpointError(
                f"{path}: corrupt safetensors header: {name} spans {end - begin} bytes "
                f"for shape {list(shape)} {dtype}")
        if end > data_size or begin > end:
            raise CheckpointError(
                f"{path}: truncated safetensors file: {name} ends at data byte {end}, "
                f"the file holds {data_size} data bytes")
        out[name] = HeaderEntry(dtype, shape, end - begin)
    return out
