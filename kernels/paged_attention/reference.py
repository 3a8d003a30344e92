"""Torch twins of paged attention: KV write, varlen prefill/extend, batched decode.

Pool layout (one full-attention layer)::

    k_cache, v_cache : [num_pages, PAGE, Hkv, D]      PAGE = 64 tokens
    token t of a sequence lives at page_table[b, t // PAGE], row t % PAGE

A flat slot index is ``page * PAGE + row``; ``slot_mapping[i]`` is the slot
new token ``i`` is written to. Queries are packed varlen::

    q          : [T, Hq, D]         tokens of all sequences back to back
    cu_seqlens : [B + 1] int        sequence b owns q[cu[b]:cu[b+1]]
    seq_lens   : [B] int            context length of b *after* this step,
                                    so its queries sit at positions
                                    seq_lens[b] - n_b ... seq_lens[b] - 1
    page_table : [B, max_pages] int32, entries past the context unused

GQA: query head h reads kv head h // (Hq // Hkv). Prefill uses torch's
fused scaled-dot-product attention with an explicit causal mask; a short
chunk at the end of a long context (a resumed prompt's tail: at most
``SHORT_TAIL`` queries) reads the pool in place instead, one run of
consecutive pages at a time, with batched matmuls per kv head (no gathered
copy of the context, no expansion of the kv heads).
Nothing outside a sequence's first ``seq_lens[b]`` slots is read into a
result: masked keys and values are replaced, not multiplied by zero, so a
NaN-filled free page cannot leak into an output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` [T, Hkv, D] into their slots of the pool, in place. Every slot must be a
    real one (>= 0): the Triton form skips a negative slot, this one raises, and the serving path makes none
    (masking here would cost a select per layer on the CPU's hot path)."""
    num_pages, page, hkv, d = k_cache.shape
    k_flat = k_cache.view(num_pages * page, hkv, d)
    v_flat = v_cache.view(num_pages * page, hkv, d)
    idx = slot_mapping.long()
    k_flat.index_copy_(0, idx, key.to(k_cache.dtype))
    v_flat.index_copy_(0, idx, value.to(v_cache.dtype))


SHORT_TAIL = 64


def page_runs(pages: list[int], length: int, page: int) -> list[tuple[int, int, int]]:
    """The first ``length`` tokens' pages as runs of consecutive page ids: (first page, pages, tokens)."""
    used = pages[:(length + page - 1) // page]
    runs, at = [], 0
    while at < len(used):
        end = at + 1
        while end < len(used) and used[end] == used[end - 1] + 1:
            end += 1
        runs.append((used[at], end - at, min(length, end * page) - at * page))
        at = end
    return runs


def tail_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pages: list[int], length: int,
                   scale: float) -> torch.Tensor:
    """``n`` queries [n, Hq, D], the last ``n`` positions of a ``length``-token context, over its pages.

    The keys and values are read in place, one run of consecutive pages at a
    time (views, no gathered copy of the context); no kv head is expanded."""
    n, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    rows = q.reshape(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)  # row gi * n + i
    runs = [(k_cache[p:p + c].reshape(c * page, hkv, d)[:t], v_cache[p:p + c].reshape(c * page, hkv, d)[:t])
            for p, c, t in page_runs(pages, length, page)]
    scores = torch.cat([torch.bmm(rows, k.to(q.dtype).permute(1, 2, 0)) for k, _ in runs], dim=-1).float() * scale
    qpos = (length - n) + torch.arange(n, device=q.device).repeat(g)
    hidden = torch.arange(length, device=q.device).view(1, length) > qpos.view(g * n, 1)
    scores.masked_fill_(hidden.unsqueeze(0), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [Hkv, g * n, length]
    out, at = None, 0
    for _, v in runs:
        part = torch.bmm(probs[:, :, at:at + v.shape[0]], v.to(q.dtype).permute(1, 0, 2))
        out = part if out is None else out + part
        at += v.shape[0]
    return out.reshape(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq, d)


def gather_context(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence as [length, Hkv, D]."""
    page = cache.shape[1]
    used = (length + page - 1) // page
    return cache[pages[:used].long()].reshape(used * page, *cache.shape[2:])[:length]


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a varlen chunk batch over each sequence's pages.

    Each query attends to every earlier token of its sequence (from the pool)
    and to itself. Returns [T, Hq, D] in the query's dtype, times ``sigmoid(gate)``
    ([T, Hq, D]) when a gate is given (the gated attention's output gate).
    """
    total, hq, d = query.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    out = torch.empty_like(query)
    cu = cu_seqlens.tolist()
    lens = seq_lens.tolist()
    for b in range(len(lens)):
        qs, qe = cu[b], cu[b + 1]
        n, length = qe - qs, lens[b]
        if n == 0:
            continue
        start = length - n
        if n <= SHORT_TAIL < length:
            out[qs:qe] = tail_attention(query[qs:qe], k_cache, v_cache, page_table[b].tolist(), length, scale)
            continue
        k = gather_context(k_cache, page_table[b], length).to(query.dtype)
        v = gather_context(v_cache, page_table[b], length).to(query.dtype)
        q = query[qs:qe].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        qpos = torch.arange(start, length, device=query.device).view(n, 1)
        kpos = torch.arange(length, device=query.device).view(1, length)
        o = F.scaled_dot_product_attention(
            q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            attn_mask=kpos <= qpos, scale=scale, enable_gqa=group > 1)
        out[qs:qe] = o[0].transpose(0, 1)
    return out if gate is None else out * torch.sigmoid(gate)


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) over contexts of different lengths.

    Vectorised over the batch: contexts are gathered to the longest one (one copy of the used pages),
    the positions past each sequence's length zeroed in that copy (the pool may hold anything there,
    NaN included) and masked in the one fused attention call. A sequence of length 0 gets zeros.
    Returns [B, Hq, D].
    """
    bsz, hq, d = query.shape
    page = k_cache.shape[1]
    hkv = k_cache.shape[2]
    max_len = int(seq_lens.max())
    used = (max_len + page - 1) // page
    pages = page_table[:, :used].long().clamp(min=0)
    k = k_cache[pages].reshape(bsz, used * page, hkv, d)[:, :max_len]  # a copy: masked in place below
    v = v_cache[pages].reshape(bsz, used * page, hkv, d)[:, :max_len]
    valid = torch.arange(max_len, device=query.device).view(1, max_len) < seq_lens.view(bsz, 1)
    invalid4 = ~valid.view(bsz, max_len, 1, 1)
    k = k.masked_fill_(invalid4, 0).to(query.dtype).transpose(1, 2)  # [B, Hkv, L, D]
    v = v.masked_fill_(invalid4, 0).to(query.dtype).transpose(1, 2)
    o = F.scaled_dot_product_attention(query.view(bsz, hq, 1, d), k, v, attn_mask=valid.view(bsz, 1, 1, max_len),
                                       scale=scale, enable_gqa=hq != hkv)  # [B, Hq, 1, D]
    o = torch.where(seq_lens.view(bsz, 1, 1, 1) > 0, o, torch.zeros((), dtype=o.dtype, device=o.device))
    return o.reshape(bsz, hq, d)
