"""Kernel 1 of the Triton chunked prefill (``triton_chunk``): the per-chunk WY form.

One program per (chunk, value head), all chunks of all sequences in parallel;
it writes ``u = (I + A)^-1 (beta * v)`` and ``w = (I + A)^-1 (beta * exp(gc) * k)``
to fp32 scratch through the blocked inverse of ``I + A``. The module docstring
of ``triton_chunk`` describes the scheme, the grid and its chunk lookup
(``chunk_sequence`` and ``chunk_span``, shared with the output pass), and the precisions.
"""

from __future__ import annotations

import triton
import triton.language as tl

BC = 16  # block size of the blocked (I + A)^-1


@triton.jit
def load_qk_rows(ptr, tok, head, s_t, s_h, s_d, offs_k, t_mask, k_mask):
    """[rows, BK] of q or k for one head, L2-normalised in fp32 (zeros where masked)."""
    x = tl.load(ptr + tok[:, None] * s_t + head * s_h + offs_k[None, :] * s_d,
                mask=t_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


@triton.jit
def _diag_inverses(a0, a1, a2, a3, BC: tl.constexpr):
    """(I + a)^-1 of four strictly lower [BC, BC] blocks, by forward substitution run on all four at once.

    Row i of the inverse is e_i - sum_{j<i} a[i, j] * (row j of the inverse); starting
    from I - a, rows 0 and 1 are already final.
    """
    offs = tl.arange(0, BC)
    rows = offs[:, None]
    cols = offs[None, :]
    eye = tl.where(rows == cols, 1.0, 0.0)
    t0, t1, t2, t3 = tl.trans(a0), tl.trans(a1), tl.trans(a2), tl.trans(a3)  # column i of t = row i of a
    i0, i1, i2, i3 = eye - a0, eye - a1, eye - a2, eye - a3
    for i in range(2, BC):
        e_i = tl.where(offs == i, 1.0, 0.0)
        r0 = e_i - tl.sum(tl.sum(tl.where(cols == i, t0, 0.0), 1)[:, None] * i0, 0)
        r1 = e_i - tl.sum(tl.sum(tl.where(cols == i, t1, 0.0), 1)[:, None] * i1, 0)
        r2 = e_i - tl.sum(tl.sum(tl.where(cols == i, t2, 0.0), 1)[:, None] * i2, 0)
        r3 = e_i - tl.sum(tl.sum(tl.where(cols == i, t3, 0.0), 1)[:, None] * i3, 0)
        i0 = tl.where(rows == i, r0[None, :], i0)
        i1 = tl.where(rows == i, r1[None, :], i1)
        i2 = tl.where(rows == i, r2[None, :], i2)
        i3 = tl.where(rows == i, r3[None, :], i3)
    return i0, i1, i2, i3


@triton.jit
def _unit_lower_inverse(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, BC: tl.constexpr):
    """Blocked (I + A)^-1 for a strictly lower A given as its 4 x 4 grid of [BC, BC] blocks
    (a_rc: row block r, column block c, r >= c). Returns the inverse's blocks in the same order.

    The diagonal blocks are inverted by ``_diag_inverses``; then, with
    inv([[P, 0], [Q, R]]) = [[P^-1, 0], [-R^-1 Q P^-1, R^-1]], pairs of blocks
    are merged into 2 x 2 ones and those into the whole: 16 [BC, BC] fp32 dots.
    """
    i00, i11, i22, i33 = _diag_inverses(a00, a11, a22, a33, BC)
    i10 = -tl.dot(tl.dot(i11, a10, input_precision="ieee"), i00, input_precision="ieee")
    i32 = -tl.dot(tl.dot(i33, a32, input_precision="ieee"), i22, input_precision="ieee")
    # Q P^-1 with Q = [[a20, a21], [a30, a31]] and P^-1 = [[i00, 0], [i10, i11]]
    x20 = tl.dot(a21, i10, tl.dot(a20, i00, input_precision="ieee"), input_precision="ieee")
    x21 = tl.dot(a21, i11, input_precision="ieee")
    x30 = tl.dot(a31, i10, tl.dot(a30, i00, input_precision="ieee"), input_precision="ieee")
    x31 = tl.dot(a31, i11, input_precision="ieee")
    # -R^-1 (Q P^-1) with R^-1 = [[i22, 0], [i32, i33]]
    i20 = -tl.dot(i22, x20, input_precision="ieee")
    i21 = -tl.dot(i22, x21, input_precision="ieee")
    i30 = -tl.dot(i33, x30, tl.dot(i32, x20, input_precision="ieee"), input_precision="ieee")
    i31 = -tl.dot(i33, x31, tl.dot(i32, x21, input_precision="ieee"), input_precision="ieee")
    return i00, i10, i11, i20, i21, i22, i30, i31, i32, i33


@triton.jit
def _kkt_block(k_r, k_c, beta_r, gc_r, gc_c, DIAG: tl.constexpr, PREC: tl.constexpr):
    """Block (r, c) of A = strictly_lower(beta_i k_i.k_j exp(gc_i - gc_j))."""
    d = gc_r[:, None] - gc_c[None, :]
    if DIAG:
        offs = tl.arange(0, k_r.shape[0])
        d = tl.where(offs[:, None] > offs[None, :], d, float("-inf"))
    return tl.dot(k_r, tl.trans(k_c), input_precision=PREC) * beta_r[:, None] * tl.exp(d)


@triton.jit
def _vec(ptr, tok, h, s_t, s_h, t_mask):
    return tl.load(ptr + tok * s_t + h * s_h, mask=t_mask, other=0.0).to(tl.float32)


@triton.jit
def _beta_v(v, beta, tok, t_mask, h, s_v_t, s_v_h, s_v_d, s_bt_t, s_bt_h, offs_v, v_mask):
    """beta * v for one block of rows, fp32, zeros where masked."""
    b_v = tl.load(v + tok[:, None] * s_v_t + h * s_v_h + offs_v[None, :] * s_v_d,
                  mask=t_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
    return b_v * _vec(beta, tok, h, s_bt_t, s_bt_h, t_mask)[:, None]


@triton.jit
def _store_rows(buf, tok, t_mask, h, x, s_t, s_h, offs, mask):
    tl.store(buf + tok[:, None] * s_t + h * s_h + offs[None, :], x, mask=t_mask[:, None] & mask[None, :])


@triton.jit
def chunk_sequence(chunk_end, n_seqs, ic, BS: tl.constexpr):
    """The sequence that owns global chunk ``ic``: the first b with chunk_end[b] > ic (chunk_end:
    inclusive cumsum of the sequences' chunk counts), or n_seqs for the grid's spare tail."""
    offs_s = tl.arange(0, BS)
    b = 0
    for s0 in range(0, n_seqs, BS):
        ends = tl.load(chunk_end + s0 + offs_s, mask=s0 + offs_s < n_seqs, other=ic + 1)
        b += tl.sum((ends <= ic).to(tl.int32), 0)
    return b


@triton.jit
def chunk_span(chunk_end, cu_seqlens, b, ic, BT: tl.constexpr):
    """Token range [bos, eos) of global chunk ``ic`` of sequence ``b`` (a real one: b < n_seqs)."""
    first = tl.load(chunk_end + b - 1, mask=b > 0, other=0).to(tl.int64)
    bos = tl.load(cu_seqlens + b).to(tl.int64) + (ic - first) * BT
    return bos, tl.minimum(bos + BT, tl.load(cu_seqlens + b + 1).to(tl.int64))


@triton.jit(do_not_specialize=["n_seqs"])  # varies with the batch: one compiled variant serves all
def _chunk_wy_kernel(
    k, v, g, beta, cu_seqlens, chunk_end, n_seqs, u_buf, w_buf,
    s_k_t, s_k_h, s_k_d, s_v_t, s_v_h, s_v_d, s_g_t, s_g_h, s_bt_t, s_bt_h,
    s_u_t, s_u_h, s_w_t, s_w_h,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, BS: tl.constexpr,
    PREC: tl.constexpr,
):
    tl.static_assert(BT == 4 * BC)
    ic = tl.program_id(0)
    h = tl.program_id(1)
    b = chunk_sequence(chunk_end, n_seqs, ic, BS)
    if b >= n_seqs:  # the grid's tail past the last chunk has nothing to do
        return
    bos, eos = chunk_span(chunk_end, cu_seqlens, b, ic, BT)

    offs_c = tl.arange(0, BC)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BDV)
    k_mask = offs_k < K
    v_mask = offs_v < V
    # the chunk as four blocks of BC rows; k, g, beta first, v only once (I + A)^-1 is known
    tok0 = bos + offs_c
    tok1 = tok0 + BC
    tok2 = tok0 + 2 * BC
    tok3 = tok0 + 3 * BC
    m0, m1, m2, m3 = tok0 < eos, tok1 < eos, tok2 < eos, tok3 < eos
    hk = h // REP
    k0 = load_qk_rows(k, tok0, hk, s_k_t, s_k_h, s_k_d, offs_k, m0, k_mask)
    k1 = load_qk_rows(k, tok1, hk, s_k_t, s_k_h, s_k_d, offs_k, m1, k_mask)
    k2 = load_qk_rows(k, tok2, hk, s_k_t, s_k_h, s_k_d, offs_k, m2, k_mask)
    k3 = load_qk_rows(k, tok3, hk, s_k_t, s_k_h, s_k_d, offs_k, m3, k_mask)
    g0, g1 = _vec(g, tok0, h, s_g_t, s_g_h, m0), _vec(g, tok1, h, s_g_t, s_g_h, m1)
    g2, g3 = _vec(g, tok2, h, s_g_t, s_g_h, m2), _vec(g, tok3, h, s_g_t, s_g_h, m3)
    beta0, beta1 = _vec(beta, tok0, h, s_bt_t, s_bt_h, m0), _vec(beta, tok1, h, s_bt_t, s_bt_h, m1)
    beta2, beta3 = _vec(beta, tok2, h, s_bt_t, s_bt_h, m2), _vec(beta, tok3, h, s_bt_t, s_bt_h, m3)
    gc0 = tl.cumsum(g0, 0)
    gc1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
    gc2 = tl.cumsum(g2, 0) + (tl.sum(g0, 0) + tl.sum(g1, 0))
    gc3 = tl.cumsum(g3, 0) + (tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0))

    a00 = _kkt_block(k0, k0, beta0, gc0, gc0, True, PREC)
    a10 = _kkt_block(k1, k0, beta1, gc1, gc0, False, PREC)
    a11 = _kkt_block(k1, k1, beta1, gc1, gc1, True, PREC)
    a20 = _kkt_block(k2, k0, beta2, gc2, gc0, False, PREC)
    a21 = _kkt_block(k2, k1, beta2, gc2, gc1, False, PREC)
    a22 = _kkt_block(k2, k2, beta2, gc2, gc2, True, PREC)
    a30 = _kkt_block(k3, k0, beta3, gc3, gc0, False, PREC)
    a31 = _kkt_block(k3, k1, beta3, gc3, gc1, False, PREC)
    a32 = _kkt_block(k3, k2, beta3, gc3, gc2, False, PREC)
    a33 = _kkt_block(k3, k3, beta3, gc3, gc3, True, PREC)
    y0 = k0 * (beta0 * tl.exp(gc0))[:, None]
    y1 = k1 * (beta1 * tl.exp(gc1))[:, None]
    y2 = k2 * (beta2 * tl.exp(gc2))[:, None]
    y3 = k3 * (beta3 * tl.exp(gc3))[:, None]
    i00, i10, i11, i20, i21, i22, i30, i31, i32, i33 = _unit_lower_inverse(
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, BC)

    # w = (I + A)^-1 (beta * exp(gc) * k), then u = (I + A)^-1 (beta * v), block row by block row
    w0 = tl.dot(i00, y0, input_precision=PREC)
    w1 = tl.dot(i11, y1, tl.dot(i10, y0, input_precision=PREC), input_precision=PREC)
    w2 = tl.dot(i22, y2, tl.dot(i21, y1, tl.dot(i20, y0, input_precision=PREC), input_precision=PREC),
                input_precision=PREC)
    w3 = tl.dot(i31, y1, tl.dot(i30, y0, input_precision=PREC), input_precision=PREC)
    w3 = tl.dot(i33, y3, tl.dot(i32, y2, w3, input_precision=PREC), input_precision=PREC)
    _store_rows(w_buf, tok0, m0, h, w0, s_w_t, s_w_h, offs_k, k_mask)
    _store_rows(w_buf, tok1, m1, h, w1, s_w_t, s_w_h, offs_k, k_mask)
    _store_rows(w_buf, tok2, m2, h, w2, s_w_t, s_w_h, offs_k, k_mask)
    _store_rows(w_buf, tok3, m3, h, w3, s_w_t, s_w_h, offs_k, k_mask)
    x0 = _beta_v(v, beta, tok0, m0, h, s_v_t, s_v_h, s_v_d, s_bt_t, s_bt_h, offs_v, v_mask)
    x1 = _beta_v(v, beta, tok1, m1, h, s_v_t, s_v_h, s_v_d, s_bt_t, s_bt_h, offs_v, v_mask)
    x2 = _beta_v(v, beta, tok2, m2, h, s_v_t, s_v_h, s_v_d, s_bt_t, s_bt_h, offs_v, v_mask)
    x3 = _beta_v(v, beta, tok3, m3, h, s_v_t, s_v_h, s_v_d, s_bt_t, s_bt_h, offs_v, v_mask)
    u0 = tl.dot(i00, x0, input_precision=PREC)
    u1 = tl.dot(i11, x1, tl.dot(i10, x0, input_precision=PREC), input_precision=PREC)
    u2 = tl.dot(i22, x2, tl.dot(i21, x1, tl.dot(i20, x0, input_precision=PREC), input_precision=PREC),
                input_precision=PREC)
    u3 = tl.dot(i31, x1, tl.dot(i30, x0, input_precision=PREC), input_precision=PREC)
    u3 = tl.dot(i33, x3, tl.dot(i32, x2, u3, input_precision=PREC), input_precision=PREC)
    _store_rows(u_buf, tok0, m0, h, u0, s_u_t, s_u_h, offs_v, v_mask)
    _store_rows(u_buf, tok1, m1, h, u1, s_u_t, s_u_h, offs_v, v_mask)
    _store_rows(u_buf, tok2, m2, h, u2, s_u_t, s_u_h, offs_v, v_mask)
    _store_rows(u_buf, tok3, m3, h, u3, s_u_t, s_u_h, offs_v, v_mask)
