"""Triton forms of the hq-e8-2b writes: quantize-on-write into the pages, and the exact-window ring.

``write_kv``: the new tokens' keys and values are rotated in torch (one
matmul, ``codec.rotate``), then ``_quantize_kernel`` runs one program per
(token, 64-value block): it computes the block's scale (bf16), searches the
codebook for each of the block's 8 groups and stores 8 codes and the scale
into the token's page row::

    rotated : [T, V] fp32               V = Hkv * D, contiguous
    pages   : [num_pages, PAGE, R] int16    R = V/8 codes + V/64 scales (codec.py)
    slot_mapping[t] < 0: token t is skipped

The search is exhaustive over the 256 patterns as an [8 groups, 256] tile
per shift (codebook.py): per pattern, the signs follow the coordinates', and
a wrong parity costs flipping the coordinate with the least ``|z_i| |u_i|``.
Sums run over the 8 coordinates in order and ties break low, as in the twin.

``window_write``: one program per (sequence, ring row) copies the last
``min(n, W)`` new tokens' keys and values to ``ring[lane, pos % W]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignis.kernels.hq_e8 import codebook, codec

NUM_PATTERNS = codebook.NUM_PATTERNS


@triton.jit
def _search(x_blk, s_x_v, inv, offs_g, delta, words, par, norms, NP: tl.constexpr):
    """Best (squared distance, pattern) of each of a block's 8 groups for one shift ``delta``."""
    corr = tl.zeros([8, NP], dtype=tl.float32)
    least = tl.full([8, NP], float("inf"), dtype=tl.float32)
    sq = tl.zeros([8], dtype=tl.float32)
    negs = tl.zeros([8], dtype=tl.int32)
    for i in tl.static_range(8):
        w = tl.load(x_blk + (offs_g * 8 + i) * s_x_v) * inv - delta
        mag = ((words >> (3 * i)) & 7).to(tl.float32) * 0.5
        prod = tl.abs(w)[:, None] * mag[None, :]
        corr = corr + prod
        least = tl.minimum(least, prod)
        sq = sq + w * w
        negs = negs + (w < 0).to(tl.int32)
    wrong = (negs % 2)[:, None] != par[None, :]
    score = 2.0 * (corr - tl.where(wrong, 2.0 * least, 0.0)) - norms[None, :]
    top = tl.max(score, axis=1)
    pat = tl.argmax(score, axis=1, tie_break_left=True)
    return sq - top, pat


@triton.jit
def _quantize_kernel(
    x, pages, slot_mapping, table, s_x_t, s_x_v, s_pg_p, s_pg_r, s_pg_c,
    NCODE: tl.constexpr, PAGE: tl.constexpr, TARGET: tl.constexpr, NP: tl.constexpr,
):
    t = tl.program_id(0)
    blk = tl.program_id(1)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    if slot >= 0:
        x_blk = x + t.to(tl.int64) * s_x_t + blk * 64 * s_x_v
        vals = tl.load(x_blk + tl.arange(0, 64) * s_x_v)
        rms = tl.sqrt(tl.sum(vals * vals, axis=0) / 64.0)
        bits = (rms / TARGET).to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # bf16, round to nearest even
        s = (bits << 16).to(tl.float32, bitcast=True)
        inv = tl.where(s > 0.0, 1.0 / tl.where(s > 0.0, s, 1.0), 0.0)

        offs_p = tl.arange(0, NP)
        words = tl.load(table + offs_p)
        par = (words >> 24) & 1
        norms = tl.zeros([NP], dtype=tl.float32)
        for i in tl.static_range(8):
            m = ((words >> (3 * i)) & 7).to(tl.float32) * 0.5
            norms = norms + m * m
        offs_g = tl.arange(0, 8)
        d_plus, p_plus = _search(x_blk, s_x_v, inv, offs_g, 0.25, words, par, norms, NP)
        d_minus, p_minus = _search(x_blk, s_x_v, inv, offs_g, -0.25, words, par, norms, NP)
        minus = d_minus < d_plus
        pat = tl.where(minus, p_minus, p_plus)
        delta = tl.where(minus, -0.25, 0.25)

        # signs of the chosen point; fix the parity by the cheapest flip
        word = tl.load(table + pat)
        signs = tl.zeros([8], dtype=tl.int32)
        negs = tl.zeros([8], dtype=tl.int32)
        best = tl.full([8], float("inf"), dtype=tl.float32)
        flip = tl.zeros([8], dtype=tl.int32)
        for i in tl.static_range(8):
            w = tl.load(x_blk + (offs_g * 8 + i) * s_x_v) * inv - delta
            neg = (w < 0).to(tl.int32)
            negs = negs + neg
            if i < 7:
                signs = signs | (neg << i)
            prod = tl.abs(w) * (((word >> (3 * i)) & 7).to(tl.float32) * 0.5)
            flip = tl.where(prod < best, i, flip)
            best = tl.minimum(best, prod)
        wrong = (negs % 2) != ((word >> 24) & 1)
        signs = tl.where(wrong & (flip < 7), signs ^ (tl.full([8], 1, tl.int32) << flip), signs)
        code = (pat.to(tl.int32) << 8) | (minus.to(tl.int32) << 7) | signs
        code = tl.where(code >= 32768, code - 65536, code)

        page = slot // PAGE
        row = slot % PAGE
        dst = pages + page * s_pg_p + row * s_pg_r
        tl.store(dst + (blk * 8 + offs_g) * s_pg_c, code.to(tl.int16))
        tl.store(dst + (NCODE + blk) * s_pg_c, bits.to(tl.int16))


def _quantize(pages: torch.Tensor, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    t, hkv, d = x.shape
    v = hkv * d
    rows = codec.rotate(x).reshape(t, v)
    ncode = v // codec.GROUP
    if pages.shape[-1] != codec.row_width(hkv, d):
        raise ValueError(f"pages hold rows of {pages.shape[-1]} int16, {hkv} x {d} needs {codec.row_width(hkv, d)}")
    _quantize_kernel[(t, v // codec.SCALE_BLOCK)](
        rows, pages, slot_mapping, codebook.packed_table(x.device), *rows.stride(), *pages.stride(),
        NCODE=ncode, PAGE=pages.shape[1], TARGET=codec.SCALE_TARGET, NP=NUM_PATTERNS, num_warps=4,
    )


def write_kv(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Quantize ``key``/``value`` [T, Hkv, D] into their slots of the pages, in place (slot < 0 skipped)."""
    if key.shape[0] == 0:
        return
    _quantize(k_pages, key, slot_mapping)
    _quantize(v_pages, value, slot_mapping)


@triton.jit(do_not_specialize_on_alignment=["seq_lens", "lanes"])  # slices of the batch's, at any offset
def _window_write_kernel(
    k_win, v_win, key, value, cu_seqlens, seq_lens, lanes, window,
    s_kw_l, s_kw_r, s_kw_h, s_kw_d, s_vw_l, s_vw_r, s_vw_h, s_vw_d,
    s_k_t, s_k_h, s_k_d, s_v_t, s_v_h, s_v_d,
    H: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1)
    q_end = tl.load(cu_seqlens + b + 1).to(tl.int64)
    n = q_end - tl.load(cu_seqlens + b).to(tl.int64)
    keep = tl.minimum(n, window)
    if i < keep:
        t = q_end - keep + i
        pos = tl.load(seq_lens + b).to(tl.int64) - keep + i
        lane = tl.load(lanes + b).to(tl.int64)
        r = pos % window
        o_h = tl.arange(0, BH)[:, None]
        o_d = tl.arange(0, BD)[None, :]
        mask = (o_h < H) & (o_d < D)
        b_k = tl.load(key + t * s_k_t + o_h * s_k_h + o_d * s_k_d, mask=mask)
        b_v = tl.load(value + t * s_v_t + o_h * s_v_h + o_d * s_v_d, mask=mask)
        tl.store(k_win + lane * s_kw_l + r * s_kw_r + o_h * s_kw_h + o_d * s_kw_d,
                 b_k.to(k_win.dtype.element_ty), mask=mask)
        tl.store(v_win + lane * s_vw_l + r * s_vw_r + o_h * s_vw_h + o_d * s_vw_d,
                 b_v.to(v_win.dtype.element_ty), mask=mask)


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
    bsz = seq_lens.shape[0]
    if window == 0 or bsz == 0 or key.shape[0] == 0:
        return
    _, hkv, d = key.shape
    _window_write_kernel[(bsz, window)](
        k_win, v_win, key, value, cu_seqlens, seq_lens, lanes, window,
        *k_win.stride(), *v_win.stride(), *key.stride(), *value.stride(),
        H=hkv, D=d, BH=triton.next_power_of_2(hkv), BD=triton.next_power_of_2(d), num_warps=4,
    )
