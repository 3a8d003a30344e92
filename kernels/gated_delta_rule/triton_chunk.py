"""Triton form of ``chunk_gated_delta_rule``: varlen chunked prefill from the state pool.

The chunked (WY / UT-transform) form, in two kernels over chunks of
``BT = 64`` tokens (a sequence's last chunk may be short; it is padded with
k = v = g = beta = 0, which leaves the result unchanged, exactly as the twin
pads):

1. ``_chunk_wy_kernel``, one program per (chunk, value head), all chunks of
   all sequences in parallel. With ``gc`` the in-chunk cumsum of g and
   ``A = strictly_lower(beta_i k_i.k_j exp(gc_i - gc_j))``, it inverts the unit
   lower-triangular ``I + A`` by forward substitution in registers and writes::

       u = (I + A)^-1 (beta * v)               [T, Hv, Dv] fp32 scratch
       w = (I + A)^-1 (beta * exp(gc) * k)     [T, Hv, Dk] fp32 scratch

2. ``_chunk_fwd_kernel``, one program per (sequence, value head, block of
   ``BV`` value columns), walks that sequence's chunks in order with its
   ``[Dk, BV]`` slice of the fp32 state in registers::

       v_new = u - w S
       o     = (exp(gc) * q) S + (causal(q k^T * exp(gc_i - gc_j))) v_new
       S     = exp(gc_last) S + (exp(gc_last - gc) * k)^T v_new

   It reads the initial state at ``state[slots[b]]`` and writes the final one
   back there; no other slot is touched.

q and k are L2-normalised in-kernel and q scaled by Dk**-0.5, as in the twin.
fp32 inputs use IEEE fp32 dots; bf16/fp16 inputs use tf32 dots on the fp32
intermediates. Expected speed: kernel 1 is fully parallel and bound by its
O(BT^2) forward substitution (~BT^3 flops per chunk and head, CUDA cores);
kernel 2 is sequential in T / BT per sequence with five small dots per
chunk, so a single long sequence runs Hv * Dv / BV programs: about fla's
``chunk_fwd_h`` + ``chunk_fwd_o`` fused, without fla's split of the state over
key blocks. Scratch is 4 * T * Hv * (Dk + Dv) bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BT = 64


@triton.jit
def _load_qk_rows(ptr, tok, head, s_t, s_h, s_d, offs_k, t_mask, k_mask):
    """[BT, BK] rows of q or k for one head, L2-normalised in fp32 (zeros where masked)."""
    x = tl.load(ptr + tok[:, None] * s_t + head * s_h + offs_k[None, :] * s_d,
                mask=t_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


@triton.jit
def _chunk_wy_kernel(
    k, v, g, beta, chunk_bos, chunk_eos, u_buf, w_buf,
    s_k_t, s_k_h, s_k_d, s_v_t, s_v_h, s_v_d, s_g_t, s_g_h, s_bt_t, s_bt_h,
    s_u_t, s_u_h, s_w_t, s_w_h,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr,
):
    ic = tl.program_id(0)
    h = tl.program_id(1)
    bos = tl.load(chunk_bos + ic).to(tl.int64)
    eos = tl.load(chunk_eos + ic).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BDV)
    tok = bos + offs_t
    t_mask = tok < eos
    k_mask = offs_k < K
    v_mask = offs_v < V

    b_k = _load_qk_rows(k, tok, h // REP, s_k_t, s_k_h, s_k_d, offs_k, t_mask, k_mask)
    b_v = tl.load(v + tok[:, None] * s_v_t + h * s_v_h + offs_v[None, :] * s_v_d,
                  mask=t_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
    b_g = tl.load(g + tok * s_g_t + h * s_g_h, mask=t_mask, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + tok * s_bt_t + h * s_bt_h, mask=t_mask, other=0.0).to(tl.float32)
    gc = tl.cumsum(b_g, 0)

    rows = offs_t[:, None]
    cols = offs_t[None, :]
    strict = rows > cols
    decay = tl.exp(tl.where(strict, gc[:, None] - gc[None, :], float("-inf")))
    kk = tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    a = kk * b_beta[:, None] * decay  # strictly lower, zero elsewhere

    # (I + A)^-1 by forward substitution: row i = e_i - sum_{j<i} A[i, j] * row j
    inv = tl.where(rows == cols, 1.0, 0.0)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(rows == i, a, 0.0), 0)
        r_i = tl.where(offs_t == i, 1.0, 0.0) - tl.sum(a_i[:, None] * inv, 0)
        inv = tl.where(rows == i, r_i[None, :], inv)

    b_u = tl.dot(inv, b_v * b_beta[:, None], input_precision=PREC)
    b_w = tl.dot(inv, b_k * (b_beta * tl.exp(gc))[:, None], input_precision=PREC)
    tl.store(u_buf + tok[:, None] * s_u_t + h * s_u_h + offs_v[None, :], b_u,
             mask=t_mask[:, None] & v_mask[None, :])
    tl.store(w_buf + tok[:, None] * s_w_t + h * s_w_h + offs_k[None, :], b_w,
             mask=t_mask[:, None] & k_mask[None, :])


@triton.jit
def _chunk_fwd_kernel(
    q, k, g, u_buf, w_buf, state, slots, cu_seqlens, out, scale,
    s_q_t, s_q_h, s_q_d, s_k_t, s_k_h, s_k_d, s_g_t, s_g_h,
    s_u_t, s_u_h, s_w_t, s_w_h,
    s_s_n, s_s_h, s_s_k, s_s_v,
    s_o_t, s_o_h, s_o_d,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    hk = h // REP
    slot = tl.load(slots + b).to(tl.int64)
    bos = tl.load(cu_seqlens + b).to(tl.int64)
    eos = tl.load(cu_seqlens + b + 1).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    k_mask = offs_k < K
    v_mask = offs_v < V
    causal = offs_t[:, None] >= offs_t[None, :]

    s_mask = k_mask[:, None] & v_mask[None, :]
    p_s = state + slot * s_s_n + h * s_s_h + offs_k[:, None] * s_s_k + offs_v[None, :] * s_s_v
    b_s = tl.load(p_s, mask=s_mask, other=0.0).to(tl.float32)
    for c0 in range(bos, eos, BT):
        tok = c0 + offs_t
        t_mask = tok < eos
        b_q = _load_qk_rows(q, tok, hk, s_q_t, s_q_h, s_q_d, offs_k, t_mask, k_mask) * scale
        b_k = _load_qk_rows(k, tok, hk, s_k_t, s_k_h, s_k_d, offs_k, t_mask, k_mask)
        b_g = tl.load(g + tok * s_g_t + h * s_g_h, mask=t_mask, other=0.0).to(tl.float32)
        gc = tl.cumsum(b_g, 0)
        g_last = tl.sum(b_g, 0)
        b_w = tl.load(w_buf + tok[:, None] * s_w_t + h * s_w_h + offs_k[None, :],
                      mask=t_mask[:, None] & k_mask[None, :], other=0.0)
        b_u = tl.load(u_buf + tok[:, None] * s_u_t + h * s_u_h + offs_v[None, :],
                      mask=t_mask[:, None] & v_mask[None, :], other=0.0)
        v_new = b_u - tl.dot(b_w, b_s, input_precision=PREC)
        decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
        intra = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * decay
        b_o = tl.dot(b_q * tl.exp(gc)[:, None], b_s, input_precision=PREC)
        b_o += tl.dot(intra, v_new, input_precision=PREC)
        tl.store(out + tok[:, None] * s_o_t + h * s_o_h + offs_v[None, :] * s_o_d,
                 b_o.to(out.dtype.element_ty), mask=t_mask[:, None] & v_mask[None, :])
        k_dec = b_k * tl.exp(g_last - gc)[:, None]
        b_s = b_s * tl.exp(g_last) + tl.dot(tl.trans(k_dec), v_new, input_precision=PREC)
    tl.store(p_s, b_s.to(state.dtype.element_ty), mask=s_mask)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Varlen chunked prefill from each sequence's state; final states written back.

    q, k [T, Hk, Dk], v [T, Hv, Dv], g/beta [T, Hv], state [S, Hv, Dk, Dv] read
    and written at ``slots`` [B], cu_seqlens [B + 1]. Returns [T, Hv, Dv] in v's dtype.
    """
    total, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    bsz = slots.shape[0]
    if total == 0 or bsz == 0:
        return out
    cu = cu_seqlens.tolist()
    bos = [c for b in range(bsz) for c in range(cu[b], cu[b + 1], BT)]
    eos = [min(c + BT, cu[b + 1]) for b in range(bsz) for c in range(cu[b], cu[b + 1], BT)]
    dev = v.device
    u_buf = torch.empty((total, hv, dv), dtype=torch.float32, device=dev)
    w_buf = torch.empty((total, hv, dk), dtype=torch.float32, device=dev)
    bk = max(16, triton.next_power_of_2(dk))
    bdv = max(16, triton.next_power_of_2(dv))
    bv = min(32, bdv)
    prec = "ieee" if v.dtype == torch.float32 else "tf32"
    rep = hv // hk
    if bos:
        chunk_bos = torch.tensor(bos, dtype=torch.int64, device=dev)
        chunk_eos = torch.tensor(eos, dtype=torch.int64, device=dev)
        _chunk_wy_kernel[(len(bos), hv)](
            k, v, g, beta, chunk_bos, chunk_eos, u_buf, w_buf,
            *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
            u_buf.stride(0), u_buf.stride(1), w_buf.stride(0), w_buf.stride(1),
            REP=rep, K=dk, V=dv, BT=BT, BK=bk, BDV=bdv, PREC=prec,
            num_warps=8 if bk + bdv > 128 else 4,
        )
    _chunk_fwd_kernel[(bsz, hv, triton.cdiv(dv, bv))](
        q, k, g, u_buf, w_buf, state, slots, cu_seqlens, out, dk ** -0.5,
        *q.stride(), *k.stride(), *g.stride(),
        u_buf.stride(0), u_buf.stride(1), w_buf.stride(0), w_buf.stride(1),
        *state.stride(), *out.stride(),
        REP=rep, K=dk, V=dv, BT=BT, BK=bk, BV=bv, PREC=prec,
        num_warps=8 if bk >= 128 else 4, num_stages=1,  # pipelining the chunk loads overflows shared memory
    )
    return out
