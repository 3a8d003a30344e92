"""Triton form of ``decode_attention``: one query per sequence, split-K (flash-decoding).

Two kernels:

1. ``_decode_split_kernel``, one program per (sequence, kv head, context
   split): all ``G = Hq / Hkv`` query heads of the GQA group ride together as
   the rows of one ``[BG, D]`` tile (BG = G padded to >= 16 for ``tl.dot``), so
   every key/value tile is read once per group. The program walks its split's
   ``split_tokens`` keys through the page table with an online softmax and
   writes its partial result::

       mid_o   : [B, Hq, S, D] fp32   normalised partial output of split s
       mid_lse : [B, Hq, S]    fp32   log2-sum-exp of the split's scores

2. ``_decode_reduce_kernel``, one program per (sequence, query head),
   combines the ``cdiv(seq_lens[b], split_tokens)`` non-empty splits; a
   sequence of length 0 has none, reads nothing and gets zeros.

The split count S comes from the page table's width (the longest context the
batch can hold) and the GPU's SM count, so a single 64K sequence spreads over
the whole GPU. Each sequence divides its own context over the S splits
(``_split_size``: ``cdiv(seq_len, S)`` rounded up to the key tile), so a short
context in a wide table (a captured decode graph's table spans the longest
admitted sequence) still uses every split. Nothing is read back to the host
(the launch stays graph-capturable). Keys outside the context are loaded as zeros and masked to
``-inf``; splits past a sequence's end are never written nor read.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
MAX_SPLITS = 256
BATCH_SHAPED = ["split_tokens", "num_splits", "s_pt_b", "s_mo_b", "s_mo_h", "s_mo_s", "s_ml_b", "s_ml_h"]
"""Integer arguments that change with the batch (the page table's width sets the split count, and the
splits the scratch's strides): Triton would compile a variant per value class (1, a multiple of 16, other)
that a round meets; unspecialised, the warm-up's one variant serves every round."""


@triton.jit
def _split_size(length, split_tokens, num_splits, BN: tl.constexpr):
    """Keys per split of one sequence: ``split_tokens`` when fixed (> 0), else its context over the splits."""
    if split_tokens > 0:
        return split_tokens.to(tl.int64)
    per = (length + num_splits - 1) // num_splits
    return tl.maximum((per + BN - 1) // BN * BN, BN)


@triton.jit(do_not_specialize=BATCH_SHAPED, do_not_specialize_on_alignment=["page_table", "seq_lens"])
def _decode_split_kernel(
    q, k_cache, v_cache, page_table, seq_lens, mid_o, mid_lse, scale_log2, split_tokens, num_splits,
    s_q_b, s_q_h, s_q_d,
    s_kc_p, s_kc_r, s_kc_h, s_kc_d,
    s_vc_p, s_vc_r, s_vc_h, s_vc_d,
    s_pt_b, s_pt_p,
    s_mo_b, s_mo_h, s_mo_s, s_ml_b, s_ml_h,
    GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BG: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    length = tl.load(seq_lens + b).to(tl.int64)
    size = _split_size(length, split_tokens, num_splits, BN)
    lo = sp.to(tl.int64) * size
    hi = tl.minimum(length, lo + size)
    if lo < hi:
        offs_g = tl.arange(0, BG)
        offs_d = tl.arange(0, BD)
        g_mask = offs_g < GROUP
        d_mask = offs_d < D
        heads = kvh * GROUP + offs_g
        q_mask = g_mask[:, None] & d_mask[None, :]
        b_q = tl.load(q + b * s_q_b + heads[:, None] * s_q_h + offs_d[None, :] * s_q_d,
                      mask=q_mask, other=0.0)
        if UPCAST:  # the CPU interpreter's bf16 dot is wrong; it runs the dots in fp32
            b_q = b_q.to(tl.float32)
        page_row = page_table + b * s_pt_b
        m_i = tl.full([BG], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BG], dtype=tl.float32)
        acc = tl.zeros([BG, BD], dtype=tl.float32)
        for n0 in range(lo, hi, BN):
            kpos = n0 + tl.arange(0, BN)
            k_mask = kpos < hi
            pg = tl.load(page_row + (kpos // PAGE) * s_pt_p, mask=k_mask, other=0).to(tl.int64)
            row = kpos % PAGE
            kv_mask = k_mask[:, None] & d_mask[None, :]
            p_k = k_cache + (pg * s_kc_p + row * s_kc_r + kvh * s_kc_h)[:, None] + offs_d[None, :] * s_kc_d
            b_k = tl.load(p_k, mask=kv_mask, other=0.0).to(b_q.dtype)
            s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * scale_log2
            s = tl.where(k_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            p_v = v_cache + (pg * s_vc_p + row * s_vc_r + kvh * s_vc_h)[:, None] + offs_d[None, :] * s_vc_d
            b_v = tl.load(p_v, mask=kv_mask, other=0.0).to(b_q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
            m_i = m_new
        # every split here holds >= 1 valid key, so l_i >= 1 and m_i is finite
        p_mo = mid_o + b * s_mo_b + heads[:, None] * s_mo_h + sp * s_mo_s + offs_d[None, :]
        tl.store(p_mo, acc / l_i[:, None], mask=q_mask)
        tl.store(mid_lse + b * s_ml_b + heads * s_ml_h + sp, m_i + tl.log2(l_i), mask=g_mask)


@triton.jit(do_not_specialize=BATCH_SHAPED, do_not_specialize_on_alignment=["seq_lens"])
def _decode_reduce_kernel(
    mid_o, mid_lse, out, seq_lens, split_tokens, num_splits,
    s_mo_b, s_mo_h, s_mo_s, s_ml_b, s_ml_h,
    s_o_b, s_o_h, s_o_d,
    D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    length = tl.load(seq_lens + b).to(tl.int64)
    offs_d = tl.arange(0, BD)
    d_mask = offs_d < D
    res = tl.zeros([BD], dtype=tl.float32)
    if length > 0:  # length 0: no split was written, none is read, the output is zero
        n_splits = tl.cdiv(length, _split_size(length, split_tokens, num_splits, BN))
        base_o = mid_o + b * s_mo_b + h * s_mo_h
        base_l = mid_lse + b * s_ml_b + h * s_ml_h
        m = tl.load(base_l)
        acc = tl.load(base_o + offs_d, mask=d_mask, other=0.0)
        l = tl.exp2(m - m)
        for sp in range(1, n_splits):
            lse = tl.load(base_l + sp)
            o = tl.load(base_o + sp * s_mo_s + offs_d, mask=d_mask, other=0.0)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new)
            acc = acc * alpha + o * w
            l = l * alpha + w
            m = m_new
        res = acc / l
    tl.store(out + b * s_o_b + h * s_o_h + offs_d * s_o_d, res.to(out.dtype.element_ty), mask=d_mask)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 for the CPU interpreter)."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def split_plan(bsz: int, hkv: int, capacity: int, block_n: int, sms: int) -> tuple[int, int]:
    """(num_splits, split_tokens): about 4 programs per SM when contexts reach ``capacity``."""
    want = triton.cdiv(4 * sms, max(1, bsz * hkv))
    splits = max(1, min(want, triton.cdiv(capacity, block_n), MAX_SPLITS))
    split_tokens = triton.cdiv(triton.cdiv(capacity, splits), block_n) * block_n
    return triton.cdiv(capacity, split_tokens), split_tokens


def _blocks(d: int, dtype: torch.dtype, on_cpu: bool) -> tuple[int, int, int, int]:
    """(BN, BD, num_warps, num_stages) for a head dim and input dtype."""
    bd = max(16, triton.next_power_of_2(d))
    if on_cpu:
        return 16, bd, 4, 1
    tile_bytes = 64 * bd * (4 if dtype == torch.float32 else 2)
    if tile_bytes <= 16384:
        return 64, bd, 4, 3
    if tile_bytes <= 32768:
        return 64, bd, 4, 2
    return 32, bd, 4, 2


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_tokens: int | None = None,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) over contexts of different lengths.

    caches [num_pages, PAGE, Hkv, D], page_table [B, max_pages], seq_lens [B]
    (each >= 0; a sequence of length 0 gets zeros). ``split_tokens`` overrides the planned split size (a multiple
    of the key tile; tests use it). Returns [B, Hq, D] in the query's dtype.
    """
    bsz, hq, d = query.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(query)
    if bsz == 0:
        return out
    bn, bd, warps, stages = _blocks(d, query.dtype, query.device.type == "cpu")
    capacity = page_table.shape[1] * page
    if split_tokens is None:
        num_splits, _ = split_plan(bsz, hkv, capacity, bn, num_sms(query.device))
        split_tokens = 0  # each sequence spreads its own context over the splits
    else:
        if split_tokens <= 0 or split_tokens % bn:
            raise ValueError(f"split_tokens must be a positive multiple of {bn}, got {split_tokens}")
        num_splits = triton.cdiv(capacity, split_tokens)
    group = hq // hkv
    mid_o = torch.empty((bsz, hq, num_splits, d), dtype=torch.float32, device=query.device)
    mid_lse = torch.empty((bsz, hq, num_splits), dtype=torch.float32, device=query.device)
    prec = "ieee" if query.dtype == torch.float32 else "tf32"
    _decode_split_kernel[(bsz, hkv, num_splits)](
        query, k_cache, v_cache, page_table, seq_lens, mid_o, mid_lse, scale * LOG2E, split_tokens, num_splits,
        *query.stride(), *k_cache.stride(), *v_cache.stride(), *page_table.stride(),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, D=d, PAGE=page, BG=max(16, triton.next_power_of_2(group)), BN=bn, BD=bd,
        PREC=prec, UPCAST=query.device.type == "cpu", num_warps=warps, num_stages=stages,
    )
    _decode_reduce_kernel[(bsz, hq)](
        mid_o, mid_lse, out, seq_lens, split_tokens, num_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        *out.stride(), D=d, BD=bd, BN=bn, num_warps=4 if bd >= 128 else 1,
    )
    return out
