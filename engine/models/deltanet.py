"""Gated DeltaNet: the linear-attention layer of both families.

Input projections differ by family:

- qwen3_5: separate ``in_proj_qkv`` (q | k | v), ``in_proj_z``, ``in_proj_b``, ``in_proj_a``;
- qwen3_next: fused ``in_proj_qkvz`` and ``in_proj_ba``, interleaved per key
  head: for each of the Hk key heads ``[q (Dk) | k (Dk) | v (r*Dv) | z (r*Dv)]``
  and ``[b (r) | a (r)]`` with r = Hv / Hk.

Then: depthwise causal conv + SiLU over q|k|v, L2-normalised q and k, decay
``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, the
gated delta rule against the lane's fp32 state, a gated RMSNorm with z, and
out_proj.

The state depends on the projections' conv input and ``a``, ``b`` alone:
``RecurrenceInputs`` keeps those of some rows of a forward, and ``advance``
runs the conv and the delta rule over them again (no projection, gate, norm
or out_proj), which is how speculative decoding rolls a lane back
(``engine.spec_decode``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ignis.engine.forward_batch import ForwardBatch
from ignis.engine.models.config import ModelConfig
from ignis.engine.models.layers import GatedRMSNorm


@dataclass
class RecurrenceInputs:
    """Rows ``rows`` of one forward's recurrence inputs, per linear-attention layer index:
    ``(mixed [R, conv_dim], b [R, Hv], a [R, Hv])``, copies (they do not hold the forward's tensors)."""

    rows: slice
    layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def add(self, layer: int, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> None:
        self.layers[layer] = tuple(x[self.rows].clone() for x in (mixed, b, a))

    def pick(self, rows: torch.Tensor) -> dict[int, tuple[torch.Tensor, ...]]:
        """Each layer's inputs at forward rows ``rows`` (absolute, inside ``self.rows``)."""
        at = rows - self.rows.start
        return {i: tuple(x[at] for x in inputs) for i, inputs in self.layers.items()}


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fused = cfg.family == "qwen3_next"
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = cfg.linear_key_dim, cfg.linear_value_dim
        h = cfg.hidden_size
        if self.fused:
            self.in_proj_qkvz = nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * self.hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(h, 2 * self.key_dim + self.value_dim, bias=False)
            self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, self.hv, bias=False)
            self.in_proj_a = nn.Linear(h, self.hv, bias=False)
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.conv_kernel, groups=cfg.conv_dim,
                                bias=False, padding=cfg.conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def _project(self, x: torch.Tensor):
        """-> mixed q|k|v [T, conv_dim], z [T, Hv, Dv], b [T, Hv], a [T, Hv]."""
        t = x.shape[0]
        if not self.fused:
            z = self.in_proj_z(x).view(t, self.hv, self.dv)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = self.hv // self.hk
        qkvz = self.in_proj_qkvz(x).view(t, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = self.in_proj_ba(x).view(t, self.hk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        return mixed, z.reshape(t, self.hv, self.dv), b.reshape(t, self.hv), a.reshape(t, self.hv)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, ssm: torch.Tensor, conv: torch.Tensor,
                ops, keep=None, record=None) -> torch.Tensor:
        """x: [T, hidden]; ssm [lanes, Hv, Dk, Dv] and conv [lanes, C, K-1] are this layer's state.
        ``keep(part, lane, slot)``: copies this layer's ``"conv"`` or ``"ssm"`` state of ``lane`` into a
        retained slot (what ``batch.linear_waves`` keep part way through a chunk). ``record(mixed, b, a)``:
        given the recurrence inputs (``RecurrenceInputs.add``)."""
        t = x.shape[0]
        mixed, z, b, a = self._project(x)
        if record is not None:
            record(mixed, b, a)
        core = self._recur(mixed, b, a, batch, ssm, conv, ops, keep)
        core = self.norm(core, z, ops)
        return self.out_proj(core.reshape(t, -1))

    def advance(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, batch: ForwardBatch,
                ssm: torch.Tensor, conv: torch.Tensor, ops) -> None:
        """Advance the states of ``batch``'s lanes over recorded recurrence inputs (``RecurrenceInputs``)."""
        self._recur(mixed, b, a, batch, ssm, conv, ops, None)

    def _recur(self, mixed, b, a, batch: ForwardBatch, ssm, conv, ops, keep) -> torch.Tensor:
        """The conv, gating and delta rule over the rows: advances the states; -> the core output [T, Hv, Dv]."""
        t = mixed.shape[0]
        weight = self.conv1d.weight.squeeze(1)

        def conv_op(inputs, state, slots, cu_seqlens):
            return ops.causal_conv1d_varlen(inputs, weight, state, slots, cu_seqlens)

        nd = batch.num_decodes
        if nd == t:  # decode only: no scatter into a shared output
            conv_out = ops.causal_conv1d_update(mixed, weight, conv, batch.slots)
        elif nd == 0:  # prefill only: likewise (no copy of the whole chunk)
            conv_out = self._over_prefill(conv_op, (mixed,), conv, mixed, batch, keep, "conv")
        else:
            conv_out = torch.empty_like(mixed)
            if nd:
                conv_out[:nd] = ops.causal_conv1d_update(mixed[:nd], weight, conv, batch.slots[:nd])
            conv_out[nd:] = self._over_prefill(conv_op, (mixed[nd:],), conv, mixed[nd:], batch, keep, "conv")
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(t, self.hk, self.dk)
        k = k.reshape(t, self.hk, self.dk)
        v = v.reshape(t, self.hv, self.dv)
        g, beta = ops.gdn_gating(a, b, self.A_log, self.dt_bias)

        if nd == t:
            core = ops.recurrent_gated_delta_rule(q, k, v, g, beta, ssm, batch.slots)
        elif nd == 0:
            core = self._over_prefill(ops.chunk_gated_delta_rule, (q, k, v, g, beta), ssm, v, batch, keep, "ssm")
        else:
            core = torch.empty_like(v)
            if nd:
                core[:nd] = ops.recurrent_gated_delta_rule(
                    q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], ssm, batch.slots[:nd])
            core[nd:] = self._over_prefill(ops.chunk_gated_delta_rule, (q[nd:], k[nd:], v[nd:], g[nd:], beta[nd:]),
                                           ssm, v[nd:], batch, keep, "ssm")
        return core

    @staticmethod
    def _over_prefill(op, rows: tuple, state: torch.Tensor, like: torch.Tensor, batch: ForwardBatch, keep,
                      part: str) -> torch.Tensor:
        """``op(*rows, state, slots, cu_seqlens)`` over the prefill rows (``rows``: its per-token inputs; the
        output shaped as ``like``): in one call, or wave by wave, keeping this layer's ``part`` state of each
        marked lane after its wave."""
        waves = batch.linear_waves
        if waves is None:
            return op(*rows, state, batch.slots[batch.num_decodes:], batch.prefill_cu_seqlens())
        out = torch.empty_like(like)
        for wave in waves:
            r = wave.rows
            out[r] = op(*(x[r] for x in rows), state, wave.slots, wave.cu_seqlens)
            for lane, slot in wave.keeps:
                keep(part, lane, slot)
        return out
