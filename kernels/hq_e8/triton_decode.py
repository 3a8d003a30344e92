"""Triton form of hq-e8-2b ``decode_attention``: one query per sequence over compressed pages + the ring.

The wrapper rotates the query (``codec.rotate``) and launches, split-K as in
``kernels/paged_attention/triton_decode.py``:

1. ``_decode_split_kernel``, one program per (sequence, kv head, context
   split), the GQA group's query heads as the rows of one tile. Keys below
   ``L - W`` come from the pages: ``decode_rows`` turns a tile of page rows
   into rotated values in registers (codes and scales gathered, the pattern
   table read from L1) and they are scored against the rotated query; keys
   from ``L - W`` on are read exact from the lane's ring and scored against
   the plain query. One online softmax covers both; the two weighted sums
   stay apart::

       mid_o   : [B, Hq, S, 2D] fp32   [:D] rotated-domain (pages), [D:] plain (ring)
       mid_lse : [B, Hq, S]     fp32

2. the bf16 form's reduce kernel, once per half, combines the splits (a
   sequence of length 0 has none and gets zeros, so its output is zero).

The wrapper returns ``unrotate(o[:D]) + o[D:]``: with the whole context in the
window the first half is exactly zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignis.kernels.hq_e8 import codebook, codec
from ignis.kernels.paged_attention.triton_decode import (
    BATCH_SHAPED,
    LOG2E,
    _decode_reduce_kernel,
    _split_size,
    num_sms,
    split_plan,
)


@triton.jit
def decode_rows(pages, table, pg, row, mask, vidx, s_pg_p, s_pg_r, s_pg_c, NCODE: tl.constexpr):
    """Rotated values [BN, BD] fp32 of page rows (``pg``, ``row``: [BN]) at row values ``vidx`` [BD].

    Masked-out elements load code 0 and scale 0 and decode to 0.
    """
    base = (pg * s_pg_p + row * s_pg_r)[:, None]
    code = tl.load(pages + base + (vidx // 8)[None, :] * s_pg_c, mask=mask, other=0).to(tl.int32) & 0xFFFF
    sbits = tl.load(pages + base + (NCODE + vidx // 64)[None, :] * s_pg_c, mask=mask, other=0).to(tl.int32)
    scale = ((sbits & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    word = tl.load(table + (code >> 8))
    i = (vidx % 8)[None, :]
    mag = ((word >> (3 * i)) & 7).to(tl.float32) * 0.5
    flips = code & 0x7F
    par = flips ^ (flips >> 4)
    par = par ^ (par >> 2)
    par = (par ^ (par >> 1)) & 1
    neg = tl.where(i == 7, par ^ ((word >> 24) & 1), (flips >> tl.minimum(i, 6)) & 1)
    shift = tl.where(((code >> 7) & 1) == 1, -0.25, 0.25)
    return (tl.where(neg == 1, -mag, mag) + shift) * scale


@triton.jit(do_not_specialize=BATCH_SHAPED, do_not_specialize_on_alignment=["page_table", "seq_lens", "lanes"])
def _decode_split_kernel(
    q, q_rot, k_pages, v_pages, k_win, v_win, table, page_table, seq_lens, lanes, mid_o, mid_lse,
    scale_log2, split_tokens, num_splits, window,
    s_q_b, s_q_h, s_q_d, s_qr_b, s_qr_h, s_qr_d,
    s_kp_p, s_kp_r, s_kp_c, s_vp_p, s_vp_r, s_vp_c,
    s_kw_l, s_kw_r, s_kw_h, s_kw_d, s_vw_l, s_vw_r, s_vw_h, s_vw_d,
    s_pt_b, s_pt_p,
    s_mo_b, s_mo_h, s_mo_s, s_ml_b, s_ml_h,
    GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NCODE: tl.constexpr,
    BG: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
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
        b_q = tl.load(q + b * s_q_b + heads[:, None] * s_q_h + offs_d[None, :] * s_q_d, mask=q_mask, other=0.0)
        b_qr = tl.load(q_rot + b * s_qr_b + heads[:, None] * s_qr_h + offs_d[None, :] * s_qr_d,
                       mask=q_mask, other=0.0)
        if UPCAST:  # the CPU interpreter's bf16 dot is wrong; it runs the dots in fp32
            b_q = b_q.to(tl.float32)
            b_qr = b_qr.to(tl.float32)
        page_row = page_table + b * s_pt_b
        vidx = kvh * D + offs_d
        m_i = tl.full([BG], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BG], dtype=tl.float32)
        acc_c = tl.zeros([BG, BD], dtype=tl.float32)
        acc_e = tl.zeros([BG, BD], dtype=tl.float32)
        exact_from = tl.maximum(length - window, 0)
        # compressed keys: [lo, min(hi, L - W))
        c_hi = tl.minimum(hi, exact_from)
        for n0 in range(lo, c_hi, BN):
            kpos = n0 + tl.arange(0, BN)
            k_mask = kpos < c_hi
            pg = tl.load(page_row + (kpos // PAGE) * s_pt_p, mask=k_mask, other=0).to(tl.int64)
            row = kpos % PAGE
            kv_mask = k_mask[:, None] & d_mask[None, :]
            b_k = decode_rows(k_pages, table, pg, row, kv_mask, vidx, s_kp_p, s_kp_r, s_kp_c, NCODE)
            s = tl.dot(b_qr, tl.trans(b_k.to(b_qr.dtype)), input_precision=PREC) * scale_log2
            s = tl.where(k_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            b_v = decode_rows(v_pages, table, pg, row, kv_mask, vidx, s_vp_p, s_vp_r, s_vp_c, NCODE)
            b_v = b_v.to(b_qr.dtype)
            acc_c = acc_c * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
            m_i = m_new
        # exact keys: [max(lo, L - W), hi) from the ring
        lane = tl.load(lanes + b).to(tl.int64)
        ring = tl.maximum(window, 1)
        for n0 in range(tl.maximum(lo, exact_from), hi, BN):
            kpos = n0 + tl.arange(0, BN)
            k_mask = kpos < hi
            r = kpos % ring
            kv_mask = k_mask[:, None] & d_mask[None, :]
            p_k = k_win + (lane * s_kw_l + r * s_kw_r + kvh * s_kw_h)[:, None] + offs_d[None, :] * s_kw_d
            b_k = tl.load(p_k, mask=kv_mask, other=0.0).to(b_q.dtype)
            s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * scale_log2
            s = tl.where(k_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            p_v = v_win + (lane * s_vw_l + r * s_vw_r + kvh * s_vw_h)[:, None] + offs_d[None, :] * s_vw_d
            b_v = tl.load(p_v, mask=kv_mask, other=0.0).to(b_q.dtype)
            acc_c = acc_c * alpha[:, None]
            acc_e = acc_e * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
            m_i = m_new
        # every split here holds >= 1 valid key, so l_i >= 1 and m_i is finite
        p_mo = mid_o + b * s_mo_b + heads[:, None] * s_mo_h + sp * s_mo_s + offs_d[None, :]
        tl.store(p_mo, acc_c / l_i[:, None], mask=q_mask)
        tl.store(p_mo + D, acc_e / l_i[:, None], mask=q_mask)
        tl.store(mid_lse + b * s_ml_b + heads * s_ml_h + sp, m_i + tl.log2(l_i), mask=g_mask)


def _blocks(d: int, dtype: torch.dtype, on_cpu: bool) -> tuple[int, int, int, int]:
    """(BN, BD, num_warps, num_stages): decoding costs registers, so key tiles are half the bf16 form's."""
    bd = max(16, triton.next_power_of_2(d))
    if on_cpu:
        return 16, bd, 4, 1
    if bd <= 128:
        return 32, bd, 4, 2
    return 32, bd, 8, 1


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
    split_tokens: int | None = None,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) over compressed pages and the ring; shapes as in reference.py.

    ``split_tokens`` overrides the planned split size (a multiple of the key
    tile; tests use it). Returns [B, Hq, D] in the query's dtype.
    """
    bsz, hq, d = query.shape
    out = torch.empty_like(query)
    if bsz == 0:
        return out
    window, hkv = k_win.shape[1], k_win.shape[2]
    page = k_pages.shape[1]
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
    q_rot = codec.rotate(query).to(query.dtype)
    mid_o = torch.empty((bsz, hq, num_splits, 2 * d), dtype=torch.float32, device=query.device)
    mid_lse = torch.empty((bsz, hq, num_splits), dtype=torch.float32, device=query.device)
    prec = "ieee" if query.dtype == torch.float32 else "tf32"
    _decode_split_kernel[(bsz, hkv, num_splits)](
        query, q_rot, k_pages, v_pages, k_win, v_win, codebook.packed_table(query.device), page_table, seq_lens,
        lanes, mid_o, mid_lse, scale * LOG2E, split_tokens, num_splits, window,
        *query.stride(), *q_rot.stride(), *k_pages.stride(), *v_pages.stride(), *k_win.stride(), *v_win.stride(),
        *page_table.stride(), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0),
        mid_lse.stride(1),
        GROUP=group, D=d, PAGE=page, NCODE=hkv * d // codec.GROUP, BG=max(16, triton.next_power_of_2(group)),
        BN=bn, BD=bd, PREC=prec, UPCAST=query.device.type == "cpu", num_warps=warps, num_stages=stages,
    )
    halves = torch.empty((bsz, hq, 2, d), dtype=torch.float32, device=query.device)
    for half in (0, 1):
        mo = mid_o[..., half * d:(half + 1) * d]
        o = halves[:, :, half]
        _decode_reduce_kernel[(bsz, hq)](
            mo, mid_lse, o, seq_lens, split_tokens, num_splits,
            mo.stride(0), mo.stride(1), mo.stride(2), mid_lse.stride(0), mid_lse.stride(1),
            *o.stride(), D=d, BD=bd, BN=bn, num_warps=4 if bd >= 128 else 1,
        )
    out.copy_(codec.unrotate(halves[:, :, 0]) + halves[:, :, 1])
    return out
