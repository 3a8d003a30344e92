"""The hybrid decoder of both families: embeddings, mixed layers, final norm, LM head.

Module names match the checkpoints' text-model names without the leading
``model.`` (``layers.N.linear_attn.in_proj_qkv.weight``, ``embed_tokens.weight``,
``lm_head.weight``), so a loaded tensor dict goes straight into
``load_state_dict``. One forward runs a :class:`ForwardBatch` against a
:class:`ModelState`: decode steps and prefill chunks of many sequences at once.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ignis.engine.forward_batch import ForwardBatch
from ignis.engine.models.attention import GatedAttention
from ignis.engine.models.config import ModelConfig
from ignis.engine.models.decoder_parts import add_mlp_and_norms
from ignis.engine.models.deltanet import GatedDeltaNet, RecurrenceInputs
from ignis.engine.models.layers import PartialRotary, ZeroCenteredRMSNorm, embedding
from ignis.engine.models.state import ModelState
from ignis.engine.models.vision import VisionTower
from ignis.kernels.backend import Ops, select_ops


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.kind = cfg.layer_types[index]
        if self.kind == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        add_mlp_and_norms(self, cfg, cfg.is_moe_layer(index))


class HybridModel(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = PartialRotary(cfg.rotary_dim, cfg.rope_theta, cfg.yarn)
        # layer index -> index into the KV pool (full) or the state pools (linear)
        self._full_slot = {layer: i for i, layer in enumerate(cfg.full_layers)}
        self._linear_slot = {layer: i for i, layer in enumerate(cfg.linear_layers)}
        self.ops = ops
        self.vision: VisionTower | None = None  # attach_vision: a checkpoint whose vision tower was loaded
        self.lora = None  # an engine.models.lora.LoraSet when adapters are served with the model

    def attach_vision(self, tower: VisionTower) -> None:
        """Serve images: ``tower`` encodes them, and prompts holding them get mRoPE positions."""
        self.vision = tower

    def _ops(self, device: torch.device) -> Ops:
        if self.ops is None:
            self.ops = select_ops(device.type)
        return self.ops

    def sync_free_tokens(self, dtype: torch.dtype, device: torch.device) -> int | None:
        """The most tokens a forward takes without waiting on the host, so a CUDA graph can hold it (None: any)."""
        limits = [layer.mlp.sync_free_tokens(dtype, device) for layer in self.layers
                  if hasattr(layer.mlp, "sync_free_tokens")]
        limits = [n for n in limits if n is not None]
        return min(limits) if limits else None

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def body(self, batch: ForwardBatch, state: ModelState, record: RecurrenceInputs | None = None) -> torch.Tensor:
        """Hidden states of every token after the last layer, before the final norm [T, hidden].

        Each residual add runs fused with the norm after it (``ZeroCenteredRMSNorm.add``):
        the residual stream ``x`` is updated by the op that normalises it. ``record``: given each
        linear-attention layer's recurrence inputs of its rows (``advance_linear``).
        """
        ops = self._ops(batch.input_ids.device)
        if self.lora is not None:  # which rows take which adapter, for the adapted layers
            self.lora.begin(batch.seq_rows, batch.input_ids.device)
        x = self.embed_tokens(batch.input_ids)
        if batch.embed_rows is not None:
            x[batch.embed_rows] = batch.embed_values.to(x.dtype)
        if batch.mrope_positions is not None:
            cos_sin = self.rotary.mrope_cos_sin(batch.mrope_positions, self.vision.cfg.mrope_section, x.dtype)
        else:
            cos_sin = self.rotary.cos_sin(batch.positions, x.dtype)
        out = None  # the previous layer's MLP output, not yet added to x
        for i, layer in enumerate(self.layers):
            if out is None:
                h = layer.input_layernorm(x, ops)
            else:
                x, h = layer.input_layernorm.add(out, x, ops)
            if layer.kind == "full_attention":
                h = layer.self_attn(h, batch, cos_sin, state.kv[self._full_slot[i]], ops)
            else:
                j = self._linear_slot[i]
                h = layer.linear_attn(h, batch, state.ssm[j], state.conv[j], ops, _keeper(batch, state, j),
                                      None if record is None else functools.partial(record.add, i))
            x, h = layer.post_attention_layernorm.add(h, x, ops)
            out = layer.mlp(h, ops)
        return x if out is None else x + out

    @torch.inference_mode()
    def advance_linear(self, batch: ForwardBatch, state: ModelState, inputs: dict) -> None:
        """Advance the recurrent and conv states of ``batch``'s lanes over its tokens, given each
        linear-attention layer's recurrence inputs for them (``RecurrenceInputs.pick`` of an earlier
        ``body``'s record): the conv and delta rule alone, no projection, attention, MLP or head."""
        ops = self._ops(batch.input_ids.device)
        for i, (mixed, b, a) in sorted(inputs.items()):
            j = self._linear_slot[i]
            self.layers[i].linear_attn.advance(mixed, b, a, batch, state.ssm[j], state.conv[j], ops)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [R, vocab] of R rows of hidden states: the final norm and the LM head."""
        return torch.nn.functional.linear(self.norm(x, self._ops(x.device)), self.head_weight())

    @torch.inference_mode()
    def forward_hidden(self, batch: ForwardBatch, state: ModelState,
                       record: RecurrenceInputs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the ``batch.logits_indices`` rows and the final-normed hidden states of every
        token [T, hidden] (what the multi-token-prediction head takes in, ``engine.spec_decode``)."""
        normed = self.norm(self.body(batch, state, record), self._ops(batch.input_ids.device))
        return torch.nn.functional.linear(normed[batch.logits_indices], self.head_weight()), normed

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, state: ModelState, all_logits: bool = False) -> torch.Tensor:
        """Logits [S, vocab] of the last token of each sampled sequence (``batch.logits_indices``).

        The head runs on those S rows only, never on a prefill's other
        positions. ``all_logits`` gives every token's logits [T, vocab]
        instead, for checks against a reference model; the runner never asks
        for them.
        """
        x = self.body(batch, state)
        if not all_logits:
            x = x[batch.logits_indices]
        return self.head(x)


def _keeper(batch: ForwardBatch, state: ModelState, layer: int):
    """What linear-attention layer ``layer`` keeps images with, when ``batch`` keeps any part way."""
    if batch.linear_waves is None:
        return None
    return functools.partial(state.keep_part, layer)
