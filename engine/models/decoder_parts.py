"""What every decoder layer holds beside its token mixer: the MLP and the two norms around it.

The target's layers (``hybrid.DecoderLayer``) and the multi-token-prediction
head's (``mtp.MtpLayer``) set these up alike, under the checkpoints' names
(``mlp``, ``input_layernorm``, ``post_attention_layernorm``).
"""

from __future__ import annotations

from torch import nn

from ignis.engine.models.config import ModelConfig
from ignis.engine.models.layers import SwiGLU, ZeroCenteredRMSNorm
from ignis.engine.models.moe import SparseMoE


def add_mlp_and_norms(layer: nn.Module, cfg: ModelConfig, moe: bool) -> None:
    """Give ``layer`` its MLP (``SparseMoE`` when ``moe``, else a dense ``SwiGLU``) and its
    input and post-attention norms; called after the layer's attention is set up."""
    if moe:
        layer.mlp = SparseMoE(cfg)
    else:
        layer.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
    layer.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    layer.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
