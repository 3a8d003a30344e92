"""Triton form of hq-e8-2b ``prefill_attention``: causal varlen chunks over compressed pages + exact window.

One program per (sequence, block of ``BMQ`` queries, kv head); its tile rows
are (query, head of the GQA group) pairs, ``row = qi * GP + gh`` with ``GP``
the group padded to a power of two, so each page tile is decoded once for
the whole group. The wrapper rotates the queries; per query at position p::

    key j <= p - W       compressed, scored against the rotated query
    p - W < j <= p       exact: the chunk's own keys for j >= start,
                         the lane's ring (as before the chunk) for j < start

Keys ``[0, pmin - W]`` (``pmin`` the block's first query) are compressed for
every row and take a loop with no masks; the rest, up to the block's last
query, take the mixed loop where each tile is decoded and read exact, and
each element goes to the side its position calls for. One online softmax
covers both sides; the rotated-domain and plain sums are kept apart and the
wrapper returns ``unrotate(o_c) + o_e``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignis.kernels.hq_e8 import codebook, codec
from ignis.kernels.hq_e8.triton_decode import decode_rows
from ignis.kernels.paged_attention.triton_prefill import LOG2E


@triton.jit
def _softmax_step(s, m_i, l_i):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit(do_not_specialize=["s_pt_b"], do_not_specialize_on_alignment=["page_table", "seq_lens", "lanes"])
def _prefill_kernel(
    q, q_rot, key, value, k_pages, v_pages, k_win, v_win, table, out_c, out_e,
    page_table, cu_seqlens, seq_lens, lanes, scale_log2, window,
    s_q_t, s_q_h, s_q_d, s_qr_t, s_qr_h, s_qr_d,
    s_k_t, s_k_h, s_k_d, s_v_t, s_v_h, s_v_d,
    s_kp_p, s_kp_r, s_kp_c, s_vp_p, s_vp_r, s_vp_c,
    s_kw_l, s_kw_r, s_kw_h, s_kw_d, s_vw_l, s_vw_r, s_vw_h, s_vw_d,
    s_oc_t, s_oc_h, s_oe_t, s_oe_h,
    s_pt_b, s_pt_p,
    GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NCODE: tl.constexpr,
    BMQ: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    m0 = tl.program_id(1) * BMQ
    kvh = tl.program_id(2)
    q_start = tl.load(cu_seqlens + b).to(tl.int64)
    n = tl.load(cu_seqlens + b + 1).to(tl.int64) - q_start
    if m0 < n:
        length = tl.load(seq_lens + b).to(tl.int64)
        start = length - n
        lane = tl.load(lanes + b).to(tl.int64)
        ring = tl.maximum(window, 1)
        offs_r = tl.arange(0, BMQ * GP)
        qi = m0 + offs_r // GP
        head = kvh * GROUP + offs_r % GP
        r_mask = (qi < n) & (offs_r % GP < GROUP)
        offs_d = tl.arange(0, BD)
        d_mask = offs_d < D
        q_mask = r_mask[:, None] & d_mask[None, :]
        tok = q_start + qi
        b_q = tl.load(q + (tok * s_q_t + head * s_q_h)[:, None] + offs_d[None, :] * s_q_d, mask=q_mask, other=0.0)
        b_qr = tl.load(q_rot + (tok * s_qr_t + head * s_qr_h)[:, None] + offs_d[None, :] * s_qr_d,
                       mask=q_mask, other=0.0)
        if UPCAST:  # the CPU interpreter's bf16 dot is wrong; it runs the dots in fp32
            b_q = b_q.to(tl.float32)
            b_qr = b_qr.to(tl.float32)
        qpos = start + qi
        page_row = page_table + b * s_pt_b
        vidx = kvh * D + offs_d

        m_i = tl.full([BMQ * GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BMQ * GP], dtype=tl.float32)
        acc_c = tl.zeros([BMQ * GP, BD], dtype=tl.float32)
        acc_e = tl.zeros([BMQ * GP, BD], dtype=tl.float32)
        pmin = start + m0
        hi = tl.minimum(length, start + m0 + BMQ)
        # keys [0, full_hi) are compressed for every row of the block
        full_hi = (tl.maximum(pmin - window + 1, 0) // BN) * BN
        for n0 in range(0, full_hi, BN):
            kpos = n0 + tl.arange(0, BN)
            pg = tl.load(page_row + (kpos // PAGE) * s_pt_p).to(tl.int64)
            row = kpos % PAGE
            kv_mask = (kpos < full_hi)[:, None] & d_mask[None, :]
            b_k = decode_rows(k_pages, table, pg, row, kv_mask, vidx, s_kp_p, s_kp_r, s_kp_c, NCODE)
            s = tl.dot(b_qr, tl.trans(b_k.to(b_qr.dtype)), input_precision=PREC) * scale_log2
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
            b_v = decode_rows(v_pages, table, pg, row, kv_mask, vidx, s_vp_p, s_vp_r, s_vp_c, NCODE)
            b_v = b_v.to(b_qr.dtype)
            acc_c = acc_c * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
            acc_e = acc_e * alpha[:, None]
        # mixed keys [full_hi, hi): each element compressed, exact or masked
        for n0 in range(full_hi, hi, BN):
            kpos = n0 + tl.arange(0, BN)
            k_in = kpos < hi
            pg = tl.load(page_row + (kpos // PAGE) * s_pt_p, mask=k_in, other=0).to(tl.int64)
            row = kpos % PAGE
            kv_mask = k_in[:, None] & d_mask[None, :]
            b_kc = decode_rows(k_pages, table, pg, row, kv_mask, vidx, s_kp_p, s_kp_r, s_kp_c, NCODE)
            in_chunk = (kpos >= start) & k_in
            in_ring = (kpos < start) & (kpos >= start - window) & (kpos >= 0)
            c_t = q_start + kpos - start
            r = kpos % ring
            ch_mask = in_chunk[:, None] & d_mask[None, :]
            ri_mask = in_ring[:, None] & d_mask[None, :]
            b_ke = (tl.load(key + (c_t * s_k_t + kvh * s_k_h)[:, None] + offs_d[None, :] * s_k_d,
                            mask=ch_mask, other=0.0).to(tl.float32)
                    + tl.load(k_win + (lane * s_kw_l + r * s_kw_r + kvh * s_kw_h)[:, None]
                              + offs_d[None, :] * s_kw_d, mask=ri_mask, other=0.0).to(tl.float32))
            s_c = tl.dot(b_qr, tl.trans(b_kc.to(b_qr.dtype)), input_precision=PREC)
            s_e = tl.dot(b_q, tl.trans(b_ke.to(b_q.dtype)), input_precision=PREC)
            packed = (kpos[None, :] <= qpos[:, None] - window) & k_in[None, :]
            exact = (kpos[None, :] > qpos[:, None] - window) & (kpos[None, :] <= qpos[:, None]) & k_in[None, :]
            s = tl.where(packed, s_c, tl.where(exact, s_e, float("-inf"))) * scale_log2
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
            b_vc = decode_rows(v_pages, table, pg, row, kv_mask, vidx, s_vp_p, s_vp_r, s_vp_c, NCODE)
            b_ve = (tl.load(value + (c_t * s_v_t + kvh * s_v_h)[:, None] + offs_d[None, :] * s_v_d,
                            mask=ch_mask, other=0.0).to(tl.float32)
                    + tl.load(v_win + (lane * s_vw_l + r * s_vw_r + kvh * s_vw_h)[:, None]
                              + offs_d[None, :] * s_vw_d, mask=ri_mask, other=0.0).to(tl.float32))
            p_c = tl.where(packed, p, 0.0).to(b_qr.dtype)
            p_e = tl.where(exact, p, 0.0).to(b_q.dtype)
            acc_c = acc_c * alpha[:, None] + tl.dot(p_c, b_vc.to(b_qr.dtype), input_precision=PREC)
            acc_e = acc_e * alpha[:, None] + tl.dot(p_e, b_ve.to(b_q.dtype), input_precision=PREC)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        tl.store(out_c + (tok * s_oc_t + head * s_oc_h)[:, None] + offs_d[None, :], acc_c / l_safe[:, None],
                 mask=q_mask)
        tl.store(out_e + (tok * s_oe_t + head * s_oe_h)[:, None] + offs_d[None, :], acc_e / l_safe[:, None],
                 mask=q_mask)


SHARED_BUDGET = 100 * 1024
"""Bytes of shared memory the block choice aims under (sm_90 allows 227 KB a block)."""


def shared_estimate(rows: int, bn: int, bd: int, elem: int, stages: int) -> int:
    """Shared-memory bytes of one program, an upper estimate: the two query tiles (rotated, plain)
    once, and per pipeline stage the four key/value tiles (compressed and exact) and the two
    probability tiles, all in ``elem``-byte elements::

        elem * (2 * rows * BD  +  stages * (4 * BN * BD + 2 * rows * BN))

    It exceeds what ``bench/gpu_check.py --compile-only`` reports for sm_90 (fp32, D = 128, 64 rows,
    BN 32, 2 stages: estimate 229376, compiled 213248)."""
    return elem * (2 * rows * bd + stages * (4 * bn * bd + 2 * rows * bn))


def _blocks(d: int, group: int, dtype: torch.dtype, on_cpu: bool) -> tuple[int, int, int, int, int, int]:
    """(GP, BMQ, BN, BD, num_warps, num_stages). Tile rows: 16 on the interpreter; on the GPU 64 up
    to D = 128 and 32 beyond (two [rows, D] fp32 accumulators live in registers). fp32 inputs take
    twice the bytes per tile: for them stages, then BN, then rows shrink (to 16) until
    ``shared_estimate`` fits ``SHARED_BUDGET``; bf16/fp16 keep the choice above."""
    gp = triton.next_power_of_2(group)
    bd = max(16, triton.next_power_of_2(d))
    if on_cpu:
        return gp, max(1, 16 // gp), 16, bd, 4, 1
    rows = 64 if bd <= 128 else 32
    bn, warps, stages = (32, 4, 2) if bd <= 128 else (32, 8, 1)
    if dtype == torch.float32:
        while shared_estimate(max(rows, gp), bn, bd, 4, stages) > SHARED_BUDGET:
            if stages > 1:
                stages -= 1
            elif bn > 16:
                bn //= 2
            elif rows > 16:
                rows //= 2
            else:
                break
    return gp, max(1, rows // gp), bn, bd, warps, stages


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
    """Causal attention of a varlen chunk batch over compressed pages + the ring; shapes as in reference.py."""
    total, hq, d = query.shape
    out = torch.empty_like(query)
    bsz = seq_lens.shape[0]
    if total == 0 or bsz == 0:
        return out
    window, hkv = k_win.shape[1], k_win.shape[2]
    group = hq // hkv
    max_n = total  # bounds the longest chunk with no read from the device; tiles past a chunk's end return
    gp, bmq, bn, bd, warps, stages = _blocks(d, group, query.dtype, query.device.type == "cpu")
    q_rot = codec.rotate(query).to(query.dtype)
    halves = torch.empty((total, hq, 2, d), dtype=torch.float32, device=query.device)
    o_c, o_e = halves[:, :, 0], halves[:, :, 1]
    prec = "ieee" if query.dtype == torch.float32 else "tf32"
    _prefill_kernel[(bsz, triton.cdiv(max_n, bmq), hkv)](
        query, q_rot, key, value, k_pages, v_pages, k_win, v_win, codebook.packed_table(query.device), o_c, o_e,
        page_table, cu_seqlens, seq_lens, lanes, scale * LOG2E, window,
        *query.stride(), *q_rot.stride(), *key.stride(), *value.stride(), *k_pages.stride(), *v_pages.stride(),
        *k_win.stride(), *v_win.stride(), o_c.stride(0), o_c.stride(1), o_e.stride(0), o_e.stride(1),
        *page_table.stride(),
        GROUP=group, GP=gp, D=d, PAGE=k_pages.shape[1], NCODE=hkv * d // codec.GROUP, BMQ=bmq, BN=bn, BD=bd,
        PREC=prec, UPCAST=query.device.type == "cpu", num_warps=warps, num_stages=stages,
    )
    out.copy_(codec.unrotate(o_c) + o_e)
    return out
