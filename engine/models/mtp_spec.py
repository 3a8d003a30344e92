"""The weight inventory of the multi-token-prediction head (``mtp.*``), the drafter of both families.

Pure Python (no torch). Checkpoints of both families name the head's tensors
under ``mtp.`` (never under ``model.``)::

    mtp.pre_fc_norm_embedding.weight [hidden]          norm of the next token's embedding
    mtp.pre_fc_norm_hidden.weight    [hidden]          norm of the target's last hidden state
    mtp.fc.weight                    [hidden, 2*hidden] over concat(embedding, hidden)
    mtp.layers.N.*                   a full-attention decoder layer (MoE MLP when the model has experts)
    mtp.norm.weight                  [hidden]          before the shared LM head

The embedding table and the LM head are the target's. Per-expert weights
(``mtp.layers.N.mlp.experts.E.gate_proj.weight``) are stacked like the
target's (``mtp.layers.N.mlp.experts.gate_up_proj``). Canonical names keep
the ``mtp.`` prefix.
"""

from __future__ import annotations

import re

from ignis.engine.models.config import ModelConfig
from ignis.engine.models.weights_spec import (NameKind, attention_tensors, dense_mlp_tensors, expert_kind,
                                             moe_mlp_tensors)

MTP_PREFIX = "mtp."
_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"^(mtp\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def mtp_layer_is_moe(cfg: ModelConfig, index: int) -> bool:
    """The head's layer ``index`` counts after the target's layers (as the checkpoints number them)."""
    return cfg.is_moe_layer(cfg.num_layers + index)


def mtp_layer_count(cfg: ModelConfig, names) -> int:
    """The config's count when it gives one, else the number of ``mtp.layers.N`` in ``names``."""
    if cfg.mtp_layers is not None:
        return cfg.mtp_layers
    found = [int(m.group(1)) for m in map(_LAYER_RE.match, names) if m]
    return max(found) + 1 if found else 0


def expected_mtp_tensors(cfg: ModelConfig, layers: int) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape of every parameter of a head with ``layers`` decoder layers."""
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.fc.weight": (h, 2 * h),
        "mtp.norm.weight": (h,),
    }
    for n in range(layers):
        p = f"mtp.layers.{n}"
        out[f"{p}.input_layernorm.weight"] = (h,)
        out.update(attention_tensors(cfg, f"{p}.self_attn"))
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
        if mtp_layer_is_moe(cfg, n):
            out.update(moe_mlp_tensors(cfg, f"{p}.mlp"))
        else:
            out.update(dense_mlp_tensors(h, cfg.intermediate_size, f"{p}.mlp"))
    return out


def classify_mtp(name: str) -> NameKind:
    """An ``mtp.`` name: a canonical tensor, or one expert's part of a stacked tensor."""
    m = _EXPERT_RE.match(name)
    return expert_kind(m) if m else NameKind("tensor", name)
