"""Kernel 1 of the Triton chunked prefill (``triton_chunk``): the per-chunk WY form.

One program per (chunk, value head), all chunks of all sequences in parallel;
it writes ``u = (I + A)^-1 (beta * v)`` and ``w = (I + A)^-1 (beta * exp(gc) * k)``
to fp32 scratch through the blocked inverse of ``I + A``. The module docstring
of ``triton_chunk`` describes the scheme, the grid and its chunk lookup
(``chunk_sequence`` and ``chunk_span``, shared with the output pass), and the precisions.

The chunk is handled as whole [BT, *] tiles wherever a dot can take them:
A is one [BT, Dk] x [Dk, BT] dot of the raw key rows (the L2 norms are the
diagonal of that product and are applied to its fp32 result); only the
inverse works on the 4 x 4 grid of [BC, BC] blocks (``_blocks`` cuts A into
it, ``_tile`` puts the inverse back together); w and u share that one
inverse, the rows' scales moved onto its columns, as [BT, BT] x [BT, BD] dots
of the raw k and v rows, BD columns at a time. Nothing of k or v is held in
registers across the inverse.
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
def _vec(ptr, tok, h, s_t, s_h, t_mask):
    return tl.load(ptr + tok * s_t + h * s_h, mask=t_mask, other=0.0).to(tl.float32)


@triton.jit
def _blocks(x, BC: tl.constexpr):
    """The lower 4 x 4 grid of [BC, BC] blocks of a [4 BC, 4 BC] tile (x_rc: row block r, column block c, r >= c)."""
    # (row block hi, lo, row, column block hi, lo, column) -> (row, column, row hi, lo, column hi, lo)
    x = tl.permute(tl.reshape(x, (2, 2, BC, 2, 2, BC)), (2, 5, 0, 1, 3, 4))
    c0, c1 = tl.split(x)           # column block lo
    c00, c10 = tl.split(c0)        # column block hi: c00 = block column 0, c10 = block column 2
    c01, c11 = tl.split(c1)        # block columns 1, 3
    r0c0, r1c0 = tl.split(c00)     # row block lo
    r0c1, r1c1 = tl.split(c01)
    r0c2, r1c2 = tl.split(c10)
    _r0c3, r1c3 = tl.split(c11)
    x00, x20 = tl.split(r0c0)      # row block hi
    x10, x30 = tl.split(r1c0)
    _x01, x21 = tl.split(r0c1)
    x11, x31 = tl.split(r1c1)
    _x02, x22 = tl.split(r0c2)
    _x12, x32 = tl.split(r1c2)
    _x13, x33 = tl.split(r1c3)
    return x00, x10, x11, x20, x21, x22, x30, x31, x32, x33


@triton.jit
def _tile(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, BC: tl.constexpr):
    """The [4 BC, 4 BC] lower block-triangular tile of the blocks ``_blocks`` returns (zeros above)."""
    z = tl.zeros_like(x00)
    # inverse of _blocks: join row block hi, then lo, then column block hi, then lo
    r0c0, r1c0 = tl.join(x00, x20), tl.join(x10, x30)
    r0c1, r1c1 = tl.join(z, x21), tl.join(x11, x31)
    r0c2, r1c2 = tl.join(z, x22), tl.join(z, x32)
    r0c3, r1c3 = tl.join(z, z), tl.join(z, x33)
    c00, c01 = tl.join(r0c0, r1c0), tl.join(r0c1, r1c1)
    c10, c11 = tl.join(r0c2, r1c2), tl.join(r0c3, r1c3)
    x = tl.join(tl.join(c00, c10), tl.join(c01, c11))
    return tl.reshape(tl.permute(x, (2, 3, 0, 4, 5, 1)), (4 * BC, 4 * BC))


@triton.jit
def _solve_cols(src, s_t, s_d, rows, c0, N: tl.constexpr, inv, dst, s_dt,
                BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    """dst[:, c0:c0 + BD] = inv @ src[:, c0:c0 + BD] over one chunk's ``rows`` valid rows (src and
    dst at the chunk's first row and its head; src read raw, fp32 dot)."""
    offs_t = tl.arange(0, BT)
    offs = c0 + tl.arange(0, BD)
    mask = (offs_t < rows)[:, None] & (offs < N)[None, :]
    x = tl.load(src + offs_t[:, None] * s_t + offs[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + offs_t[:, None] * s_dt + offs[None, :], tl.dot(inv, x, input_precision=PREC), mask=mask)


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


@triton.jit
def _chunk_wy_kernel(
    k, v, g, beta, cu_seqlens, chunk_end, n_seqs, u_buf, w_buf,
    s_k_t, s_k_h, s_k_d, s_v_t, s_v_h, s_v_d, s_g_t, s_g_h, s_bt_t, s_bt_h,
    s_u_t, s_u_h, s_w_t, s_w_h,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, BS: tl.constexpr,
    BD: tl.constexpr, PREC: tl.constexpr,
):
    tl.static_assert(BT == 4 * BC)
    ic = tl.program_id(0)
    h = tl.program_id(1)
    b = chunk_sequence(chunk_end, n_seqs, ic, BS)
    if b >= n_seqs:  # the grid's tail past the last chunk has nothing to do
        return
    bos, eos = chunk_span(chunk_end, cu_seqlens, b, ic, BT)

    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    k_mask = offs_k < K
    tok = bos + offs_t
    t_mask = tok < eos
    # A is one dot of the raw key rows, normalised afterwards on the fp32 result (bf16 keys are exact
    # in tf32: exact products, fp32 accumulation; fp32 keys use IEEE dots); |k_i|^2 is that product's diagonal, read off in
    # the dot's own layout for the rows and for the columns
    b_k = tl.load(k + tok[:, None] * s_k_t + (h // REP) * s_k_h + offs_k[None, :] * s_k_d,
                  mask=t_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
    kk = tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    diag = tl.where(offs_t[:, None] == offs_t[None, :], kk, 0.0)
    rn = tl.rsqrt(tl.sum(diag, 1) + 1e-6)
    rn_c = tl.rsqrt(tl.sum(diag, 0) + 1e-6)
    gc = tl.cumsum(_vec(g, tok, h, s_g_t, s_g_h, t_mask), 0)
    b_beta = _vec(beta, tok, h, s_bt_t, s_bt_h, t_mask)
    lower = offs_t[:, None] > offs_t[None, :]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], float("-inf")))
    a = kk * (b_beta * rn)[:, None] * (rn_c[None, :] * decay)

    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33 = _blocks(a, BC)
    i00, i10, i11, i20, i21, i22, i30, i31, i32, i33 = _unit_lower_inverse(
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, BC)
    inv = _tile(i00, i10, i11, i20, i21, i22, i30, i31, i32, i33, BC)

    # w = (I + A)^-1 diag(beta exp(gc) / |k|) k and u = (I + A)^-1 diag(beta) v: the rows' scales
    # go on the inverse's columns, so each BD columns of w or u are one [BT, BT] x [BT, BD] dot of
    # the raw rows, read again here (k: a cache hit) rather than held across the inverse
    inv_w = inv * (b_beta * tl.exp(gc) * rn_c)[None, :]
    for c0 in range(0, BK, BD):
        _solve_cols(k + bos * s_k_t + (h // REP) * s_k_h, s_k_t, s_k_d, eos - bos, c0, K, inv_w,
                    w_buf + bos * s_w_t + h * s_w_h, s_w_t, BT, BD, PREC)
    inv_u = inv * b_beta[None, :]
    for c0 in range(0, BDV, BD):
        _solve_cols(v + bos * s_v_t + h * s_v_h, s_v_t, s_v_d, eos - bos, c0, V, inv_u,
                    u_buf + bos * s_u_t + h * s_u_h, s_u_t, BT, BD, PREC)
