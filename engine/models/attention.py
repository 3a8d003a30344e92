"""Gated full attention over the paged KV pool.

q_proj yields, per head, the query and an output gate side by side
([T, Hq, 2D] -> query | gate). Queries and keys get a per-head RMSNorm and a
partial rotary embedding (one fused op each); new keys and values are written to their pages
before attending, so a chunk reads itself from the pool like any earlier
token. The attention output is gated by ``sigmoid(gate)`` before o_proj (inside the
prefill kernel's epilogue for a prefill-only chunk over a bf16 pool).

The pool's format picks the ops: a page tensor is bf16 (``ops.write_kv``,
``ops.*_attention``); a ``CompressedLayer`` is hq-e8-2b (``ops.hq_*``), whose
exact window is written by decode steps before they attend and by prefill
chunks after (kernels/hq_e8/reference.py gives the order's reason).
"""

from __future__ import annotations

import torch
from torch import nn

from ignis.engine.forward_batch import ForwardBatch
from ignis.engine.models.config import ModelConfig
from ignis.engine.models.layers import ZeroCenteredRMSNorm
from ignis.engine.models.state import CompressedLayer


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim * 2, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv, ops) -> torch.Tensor:
        """x: [T, hidden]; kv: this layer's pool slice, [2, pages, 64, Hkv, D] or a ``CompressedLayer``."""
        t = x.shape[0]
        qg = self.q_proj(x).view(t, self.num_heads, 2 * self.head_dim)
        q, gate = qg.split(self.head_dim, dim=-1)
        cos, sin = cos_sin
        q = self.q_norm.rotary(q, cos, sin, ops)
        k = self.k_norm.rotary(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin, ops)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if isinstance(kv, CompressedLayer):
            out = ops.sigmoid_mul(self._attend_compressed(q, k, v, batch, kv, ops), gate)
        else:
            out = self._attend(q, k, v, gate, batch, kv, ops)
        return self.o_proj(out.reshape(t, -1))

    def _attend(self, q, k, v, gate, batch: ForwardBatch, kv: torch.Tensor, ops) -> torch.Tensor:
        """The gated attention output over a bf16 pool."""
        t = q.shape[0]
        k_cache, v_cache = kv[0], kv[1]
        ops.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        nd = batch.num_decodes
        if nd == t:  # decode only: no scatter into a shared output
            out = ops.decode_attention(q, k_cache, v_cache, batch.page_table, batch.seq_lens, self.scale)
            return ops.sigmoid_mul(out, gate)
        if nd == 0:  # prefill only: likewise (no copy of the whole chunk), the gate in the kernel's epilogue
            return ops.prefill_attention(q, k_cache, v_cache, batch.page_table, batch.prefill_cu_seqlens(),
                                         batch.seq_lens, self.scale, gate=gate)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = ops.decode_attention(
                q[:nd], k_cache, v_cache, batch.page_table[:nd], batch.seq_lens[:nd], self.scale)
        if nd < t:
            out[nd:] = ops.prefill_attention(
                q[nd:], k_cache, v_cache, batch.page_table[nd:], batch.prefill_cu_seqlens(),
                batch.seq_lens[nd:], self.scale)
        return ops.sigmoid_mul(out, gate)

    def _attend_compressed(self, q, k, v, batch: ForwardBatch, kv: CompressedLayer, ops) -> torch.Tensor:
        t = q.shape[0]
        k_pages, v_pages = kv.pages[0], kv.pages[1]
        k_win, v_win = kv.window[:, 0], kv.window[:, 1]
        ops.hq_write_kv(k_pages, v_pages, k, v, batch.slot_mapping)
        out = torch.empty_like(q)
        nd = batch.num_decodes
        lanes = batch.slots
        if nd:
            ops.hq_window_write(k_win, v_win, k[:nd], v[:nd], batch.cu_seqlens[:nd + 1], batch.seq_lens[:nd],
                                lanes[:nd])
            out[:nd] = ops.hq_decode_attention(q[:nd], k_pages, v_pages, k_win, v_win, batch.page_table[:nd],
                                               batch.seq_lens[:nd], lanes[:nd], self.scale)
        if nd < t:
            cu = batch.prefill_cu_seqlens()
            out[nd:] = ops.hq_prefill_attention(q[nd:], k[nd:], v[nd:], k_pages, v_pages, k_win, v_win,
                                                batch.page_table[nd:], cu, batch.seq_lens[nd:], lanes[nd:],
                                                self.scale)
            ops.hq_window_write(k_win, v_win, k[nd:], v[nd:], cu, batch.seq_lens[nd:], lanes[nd:])
        return out
