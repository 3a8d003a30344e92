"""Triton form of ``prefill_attention``: causal varlen attention of chunks over their pages.

Algorithm: FlashAttention-2 style online softmax, one program per
(sequence, block of ``BM`` queries, query head). The program walks the
sequence's keys in tiles of ``BN`` tokens through the page table, from
position 0 up to its last query's position, keeping the running row max,
row sum and output accumulator in fp32::

    queries of b : positions seq_lens[b] - n_b ... seq_lens[b] - 1
    key tile     : kpos = n0 + [0, BN)    page_table[b, kpos // PAGE], row kpos % PAGE
    mask         : kpos <= qpos  (causal; the chunk reads itself from the pool)

Tiles strictly below the block's first query need no causal mask and take a
mask-free path. Keys outside the context are loaded as zeros and masked to
``-inf`` before the softmax, so NaN-filled free pages never reach an output.
GQA: query head h reads kv head ``h // (Hq // Hkv)``. Shapes and semantics as
in ``reference.py``; fp32 inputs use IEEE fp32 dots, bf16/fp16 use tensor
cores with fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    acc, m_i, l_i, b_q, k_cache, v_cache, page_row, kvh, n0, hi, qpos, offs_d, d_mask,
    s_kc_p, s_kc_r, s_kc_h, s_kc_d, s_vc_p, s_vc_r, s_vc_h, s_vc_d, s_pt_p,
    scale_log2, PAGE: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
):
    kpos = n0 + tl.arange(0, BN)
    k_mask = kpos < hi
    pg = tl.load(page_row + (kpos // PAGE) * s_pt_p, mask=k_mask, other=0).to(tl.int64)
    row = (kpos % PAGE).to(tl.int64)
    kv_mask = k_mask[:, None] & d_mask[None, :]
    p_k = k_cache + (pg * s_kc_p + row * s_kc_r + kvh * s_kc_h)[:, None] + offs_d[None, :] * s_kc_d
    b_k = tl.load(p_k, mask=kv_mask, other=0.0).to(b_q.dtype)
    s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * scale_log2
    if CAUSAL:
        valid = (kpos[None, :] <= qpos[:, None]) & k_mask[None, :]
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p_v = v_cache + (pg * s_vc_p + row * s_vc_r + kvh * s_vc_h)[:, None] + offs_d[None, :] * s_vc_d
    b_v = tl.load(p_v, mask=kv_mask, other=0.0).to(b_q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
    return acc, m_new, l_i


# The page table's width and the offset of a mixed batch's prefill rows in it change from round to round:
# unspecialised, the one variant the warm-up compiles serves them all (tests/kernels/test_kernel_variants.py).
@triton.jit(do_not_specialize=["s_pt_b"], do_not_specialize_on_alignment=["page_table", "seq_lens"])
def _prefill_kernel(
    q, k_cache, v_cache, out, gate, page_table, cu_seqlens, seq_lens, scale_log2,
    s_q_t, s_q_h, s_q_d,
    s_kc_p, s_kc_r, s_kc_h, s_kc_d,
    s_vc_p, s_vc_r, s_vc_h, s_vc_d,
    s_o_t, s_o_h, s_o_d,
    s_gt_t, s_gt_h, s_gt_d,
    s_pt_b, s_pt_p,
    GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr, GATED: tl.constexpr,
):
    b = tl.program_id(0)
    m0 = tl.program_id(1) * BM
    h = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(cu_seqlens + b).to(tl.int64)
    n = tl.load(cu_seqlens + b + 1).to(tl.int64) - q_start
    if m0 < n:
        length = tl.load(seq_lens + b).to(tl.int64)
        start = length - n
        offs_m = m0 + tl.arange(0, BM)
        offs_d = tl.arange(0, BD)
        m_mask = offs_m < n
        d_mask = offs_d < D
        q_mask = m_mask[:, None] & d_mask[None, :]
        p_q = q + (q_start + offs_m)[:, None] * s_q_t + h * s_q_h + offs_d[None, :] * s_q_d
        b_q = tl.load(p_q, mask=q_mask, other=0.0)
        if UPCAST:  # the CPU interpreter's bf16 dot is wrong; it runs the dots in fp32
            b_q = b_q.to(tl.float32)
        qpos = start + offs_m
        page_row = page_table + b * s_pt_b

        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        # keys [0, full_hi) precede every query of the block: no causal mask
        full_hi = ((start + m0) // BN) * BN
        hi = tl.minimum(length, start + m0 + BM)
        for n0 in range(0, full_hi, BN):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, b_q, k_cache, v_cache, page_row, kvh, n0, hi, qpos, offs_d, d_mask,
                s_kc_p, s_kc_r, s_kc_h, s_kc_d, s_vc_p, s_vc_r, s_vc_h, s_vc_d, s_pt_p,
                scale_log2, PAGE, BN, False, PREC)
        for n0 in range(full_hi, hi, BN):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, b_q, k_cache, v_cache, page_row, kvh, n0, hi, qpos, offs_d, d_mask,
                s_kc_p, s_kc_r, s_kc_h, s_kc_d, s_vc_p, s_vc_r, s_vc_h, s_vc_d, s_pt_p,
                scale_log2, PAGE, BN, True, PREC)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        acc = acc / l_safe[:, None]
        if GATED:  # the output gate on the fp32 result, in the epilogue: no separate pass over out
            b_gt = tl.load(gate + (q_start + offs_m)[:, None] * s_gt_t + h * s_gt_h + offs_d[None, :] * s_gt_d,
                           mask=q_mask, other=0.0).to(tl.float32)
            acc = acc * tl.sigmoid(b_gt)
        p_o = out + (q_start + offs_m)[:, None] * s_o_t + h * s_o_h + offs_d[None, :] * s_o_d
        tl.store(p_o, acc.to(out.dtype.element_ty), mask=q_mask)


def _blocks(d: int, dtype: torch.dtype, on_cpu: bool) -> tuple[int, int, int, int, int]:
    """(BM, BN, BD, num_warps, num_stages) for a head dim and input dtype."""
    bd = max(16, triton.next_power_of_2(d))
    if on_cpu:
        return 16, 32, bd, 4, 1
    wide = dtype == torch.float32
    if bd <= 64:
        return 64, 64, bd, 4, 3
    if bd <= 128:
        return 64, (32 if wide else 64), bd, 4, 2
    if wide:
        return 32, 32, bd, 8, 1
    return 128, 64, bd, 8, 2  # H200, D=256: 364 TFLOP/s on an 8K chunk, against 137 for (64, 32)


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    blocks: tuple[int, int, int, int] | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a varlen chunk batch over each sequence's pages.

    query [T, Hq, D], caches [num_pages, PAGE, Hkv, D], page_table [B, max_pages],
    cu_seqlens [B + 1], seq_lens [B] (context after this step). Returns [T, Hq, D]
    in the query's dtype, times ``sigmoid(gate)`` ([T, Hq, D], any strides) when a
    gate is given, applied to the fp32 result before its rounding. ``blocks`` (BM, BN, num_warps, num_stages) overrides the
    tile choice (``bench/gpu_check_bench.py`` sweeps it on a GPU).
    """
    total, hq, d = query.shape
    hkv = k_cache.shape[2]
    if gate is not None and gate.shape != query.shape:
        raise ValueError(f"prefill_attention: gate {tuple(gate.shape)} is not the query's {tuple(query.shape)}")
    out = torch.empty_like(query)
    bsz = seq_lens.shape[0]
    if total == 0 or bsz == 0:
        return out
    # the grid covers the longest chunk without asking the device which one it is: no chunk is longer
    # than the whole batch, and tiles past a chunk's end return at once
    bm, bn, bd, warps, stages = _blocks(d, query.dtype, query.device.type == "cpu")
    if blocks is not None:
        bm, bn, warps, stages = blocks
    prec = "ieee" if query.dtype == torch.float32 else "tf32"
    grid = (bsz, triton.cdiv(total, bm), hq)
    _prefill_kernel[grid](
        query, k_cache, v_cache, out, out if gate is None else gate, page_table, cu_seqlens, seq_lens, scale * LOG2E,
        *query.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        *(out if gate is None else gate).stride(), *page_table.stride(),
        GROUP=hq // hkv, D=d, PAGE=k_cache.shape[1], BM=bm, BN=bn, BD=bd, PREC=prec,
        UPCAST=query.device.type == "cpu", GATED=gate is not None,
        num_warps=warps, num_stages=stages,
    )
    return out

