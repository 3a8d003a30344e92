"""Torch twins of the hq-e8-2b ops: quantize-on-write, exact-window write, decode and prefill attention.

Layouts (one full-attention layer)::

    k_pages, v_pages : [num_pages, PAGE, R] int16     compressed rows (codec.py), PAGE = 64
    k_win, v_win     : [lanes, W, Hkv, D]             exact keys / values, a ring per lane:
                                                      position t of the lane's sequence at row t % W
    lanes            : [B] int                        each sequence's lane
    page_table, cu_seqlens, seq_lens, slot_mapping    as in kernels/paged_attention

The exact window: a query at position p reads keys and values at positions
``p - W < j <= p`` exact and those at ``j <= p - W`` from the compressed
pages, so what a query sees does not depend on how its prompt was chunked.
Every position is also written to the pages, so pages alone (shared, moved
between tiers) plus the ring in the state image make a sequence resumable.

Order within a layer (``engine/models/attention.py``): ``write_kv`` for every
new token; decode steps write the ring, then attend (the ring then holds
``L - W .. L - 1``); prefill chunks attend with the ring as it was before the
chunk (positions ``start - W .. start - 1``) plus the chunk's own keys and
values, then write the ring. Free pages may hold anything: nothing outside a
sequence's context reaches a result.

The twins decode and un-rotate the pages a sequence reads, per call (never
the pool), then attend in the plain domain; the Triton forms attend in the
rotated domain instead and rotate only the query and the output.
"""

from __future__ import annotations

import torch

from ignis.kernels.hq_e8 import codec
from ignis.kernels.paged_attention import reference as attn_ref


def write_kv(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Quantize ``key``/``value`` [T, Hkv, D] into their slots of the pages, in place (slot < 0 skipped)."""
    num_pages, page, width = k_pages.shape
    keep = slot_mapping >= 0
    idx = slot_mapping[keep].long()
    if idx.numel() == 0:
        return
    k_pages.view(num_pages * page, width).index_copy_(0, idx, codec.quantize_kv(key[keep]))
    v_pages.view(num_pages * page, width).index_copy_(0, idx, codec.quantize_kv(value[keep]))


def _ring_plan(cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, lanes: torch.Tensor, window: int):
    """(token index, lane, ring row) of each token that ends up in its sequence's window."""
    cu, lens, ln = cu_seqlens.tolist(), seq_lens.tolist(), lanes.tolist()
    tok, lane, row = [], [], []
    for b in range(len(lens)):
        n = cu[b + 1] - cu[b]
        keep = min(n, window)
        for i in range(keep):
            tok.append(cu[b + 1] - keep + i)
            lane.append(ln[b])
            row.append((lens[b] - keep + i) % window)
    return tok, lane, row


def window_write(
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    lanes: torch.Tensor,
) -> None:
    """Copy each sequence's last ``min(n, W)`` new keys/values [T, Hkv, D] into its lane's ring."""
    window = k_win.shape[1]
    if window == 0:
        return
    tok, lane, row = _ring_plan(cu_seqlens, seq_lens, lanes, window)
    if not tok:
        return
    dev = key.device
    t = torch.tensor(tok, device=dev)
    ln = torch.tensor(lane, device=dev)
    r = torch.tensor(row, device=dev)
    k_win[ln, r] = key[t].to(k_win.dtype)
    v_win[ln, r] = value[t].to(v_win.dtype)


def _decoded(pages: torch.Tensor, table_row: torch.Tensor, length: int, hkv: int, d: int) -> torch.Tensor:
    """The first ``length`` compressed tokens of one sequence as [length, Hkv, D] fp32."""
    rows = attn_ref.gather_context(pages, table_row.clamp(min=0), length)
    return codec.dequantize_kv(rows, hkv, d)


def decode_attention(
    query: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    lanes: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) over compressed pages and the ring (already holding the query's token).

    Each sequence's keys and values are rebuilt in the query's dtype (ring for
    the last ``W`` positions, decoded pages before them) and handed to the
    bf16 twin, so a context inside the window gives exactly its result (and
    a sequence of length 0 gets zeros).
    """
    bsz, hq, d = query.shape
    window, hkv = k_win.shape[1], k_win.shape[2]
    page = k_pages.shape[1]
    if bsz == 0:
        return torch.empty_like(query)
    lens, ln = seq_lens.tolist(), lanes.tolist()
    used = (max(lens) + page - 1) // page
    k = torch.zeros(bsz * used * page, hkv, d, dtype=query.dtype, device=query.device)
    v = torch.zeros_like(k)
    for b, length in enumerate(lens):
        base = b * used * page
        exact_from = max(0, length - window)
        if exact_from:
            k[base:base + exact_from] = _decoded(k_pages, page_table[b], exact_from, hkv, d).to(query.dtype)
            v[base:base + exact_from] = _decoded(v_pages, page_table[b], exact_from, hkv, d).to(query.dtype)
        rows = torch.arange(exact_from, length, device=query.device) % max(window, 1)
        k[base + exact_from:base + length] = k_win[ln[b], rows].to(query.dtype)
        v[base + exact_from:base + length] = v_win[ln[b], rows].to(query.dtype)
    table = torch.arange(bsz * used, dtype=torch.int32, device=query.device).view(bsz, used)
    return attn_ref.decode_attention(query, k.view(-1, page, hkv, d), v.view(-1, page, hkv, d), table,
                                     seq_lens, scale)


QUERY_BLOCK = 256
"""Queries per score block in the prefill twin (bounds its memory)."""


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    lanes: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a varlen chunk batch ([T, Hq, D]; its own keys/values ``key``, ``value``
    [T, Hkv, D]) over compressed pages and the ring as it was before the chunk. Returns [T, Hq, D]."""
    total, hq, d = query.shape
    window, hkv = k_win.shape[1], k_win.shape[2]
    group = hq // hkv
    out = torch.empty_like(query)
    cu, lens, ln = cu_seqlens.tolist(), seq_lens.tolist(), lanes.tolist()
    dev = query.device
    for b in range(len(lens)):
        qs, qe = cu[b], cu[b + 1]
        n, length = qe - qs, lens[b]
        if n == 0:
            continue
        start = length - n
        k_c = _decoded(k_pages, page_table[b], length, hkv, d)
        v_c = _decoded(v_pages, page_table[b], length, hkv, d)
        k_e = torch.zeros_like(k_c)
        v_e = torch.zeros_like(v_c)
        k_e[start:] = key[qs:qe].float()
        v_e[start:] = value[qs:qe].float()
        ring_from = max(0, start - window)
        if ring_from < start:
            rows = torch.arange(ring_from, start, device=dev) % window
            k_e[ring_from:start] = k_win[ln[b], rows].float()
            v_e[ring_from:start] = v_win[ln[b], rows].float()
        # [Hkv, L, D], query heads of a group share their kv head
        k_c, v_c, k_e, v_e = (x.transpose(0, 1).repeat_interleave(group, 0) for x in (k_c, v_c, k_e, v_e))
        kpos = torch.arange(length, device=dev).view(1, length)
        for q0 in range(0, n, QUERY_BLOCK):
            q1 = min(n, q0 + QUERY_BLOCK)
            q = query[qs + q0:qs + q1].float().transpose(0, 1)  # [Hq, m, D]
            qpos = torch.arange(start + q0, start + q1, device=dev).view(-1, 1)
            exact = (kpos > qpos - window) & (kpos <= qpos)
            packed = kpos <= qpos - window
            s_e = torch.matmul(q, k_e.transpose(1, 2)) * scale
            s_c = torch.matmul(q, k_c.transpose(1, 2)) * scale
            s = torch.where(exact, s_e, torch.where(packed, s_c, float("-inf")))
            p = torch.softmax(s, dim=-1)
            o = torch.matmul(torch.where(exact, p, 0.0), v_e) + torch.matmul(torch.where(packed, p, 0.0), v_c)
            out[qs + q0:qs + q1] = o.transpose(0, 1).to(query.dtype)
    return out
