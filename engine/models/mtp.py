"""The multi-token-prediction head (``mtp.*``): the drafter both families ship with their weights.

One draft step of row i takes the target's final-normed hidden state ``h`` of
position p and the token at p+1, and predicts the token at p+2::

    x = fc(concat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(h)))
    x = decoder layer (gated full attention + MLP, MoE when the model has experts)
    out = norm(x)                      -> logits = out @ lm_head^T (the target's head)

The row sits at position p (its rotary angle and its KV slot are p's), so
the head's KV pages are indexed like the target's. ``out`` is also the
hidden state the next draft step takes in place of the target's. With
several layers, draft step s runs layer ``s % layers``; each layer has its
own KV. The embedding table and the LM head are the target model's.

Module names match the checkpoint's names without ``mtp.``, so the loaded
``mtp.*`` tensors go into ``load_state_dict`` once the prefix is dropped.
"""

from __future__ import annotations

import torch
from torch import nn

from ignis.engine.forward_batch import ForwardBatch
from ignis.engine.models.attention import GatedAttention
from ignis.engine.models.config import ModelConfig
from ignis.engine.models.decoder_parts import add_mlp_and_norms
from ignis.engine.models.layers import ZeroCenteredRMSNorm
from ignis.engine.models.mtp_spec import MTP_PREFIX, mtp_layer_is_moe


class MtpLayer(nn.Module):
    """One full-attention decoder layer of the head."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.self_attn = GatedAttention(cfg)
        add_mlp_and_norms(self, cfg, mtp_layer_is_moe(cfg, index))


class MtpHead(nn.Module):
    def __init__(self, cfg: ModelConfig, layers: int):
        super().__init__()
        if layers < 1:
            raise ValueError("a multi-token-prediction head needs at least one decoder layer")
        h = cfg.hidden_size
        self.cfg = cfg
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(h, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(MtpLayer(cfg, i) for i in range(layers))
        self.norm = ZeroCenteredRMSNorm(h, cfg.rms_norm_eps)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @torch.inference_mode()
    def forward(self, target, batch: ForwardBatch, hidden: torch.Tensor, kv, step: int = 0) -> torch.Tensor:
        """The head's normed output [T, hidden] of the rows of ``batch``.

        ``target``: the ``HybridModel`` whose embedding, rotary tables and ops
        the head shares. ``batch.input_ids[i]`` is the token after the position
        of ``hidden[i]``; ``batch.positions[i]`` is that position. ``kv``: the
        page tensor (or compressed layer) of layer ``step % layers``.
        """
        ops = target._ops(batch.input_ids.device)
        emb = target.embed_tokens(batch.input_ids)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb, ops),
                               self.pre_fc_norm_hidden(hidden.to(emb.dtype), ops)], dim=-1))
        layer = self.layers[step % len(self.layers)]
        cos_sin = target.rotary.cos_sin(batch.positions, x.dtype)
        h = layer.self_attn(layer.input_layernorm(x, ops), batch, cos_sin, kv, ops)
        x, h = layer.post_attention_layernorm.add(h, x, ops)
        return self.norm(x + layer.mlp(h, ops), ops)

    def logits(self, target, out: torch.Tensor) -> torch.Tensor:
        """Logits [R, vocab] of rows of the head's output, through the target's LM head."""
        return torch.nn.functional.linear(out, target.head_weight())


def head_from_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor], layers: int) -> MtpHead:
    """The head with the loaded ``mtp.*`` tensors as its parameters (no second copy)."""
    with torch.device("meta"):
        head = MtpHead(cfg, layers)
    head.load_state_dict({k[len(MTP_PREFIX):]: v for k, v in tensors.items()}, strict=True, assign=True)
    return head.eval()
