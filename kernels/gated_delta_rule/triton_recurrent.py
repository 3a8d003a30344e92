"""Triton form of ``recurrent_gated_delta_rule``: one decode step per sequence, state in place.

One program per (sequence, value head, block of ``BV`` value columns) holds
its ``[Dk, BV]`` slice of the fp32 state in registers for the step::

    state[slots[b], h] : [Dk, Dv]     columns [iv*BV, iv*BV + BV) belong to program iv
    S  <- exp(g) * S
    S  <- S + k (beta * (v - S^T k))^T
    o   = S^T q                        q, k L2-normalised; q scaled by Dk**-0.5

Programs own disjoint state slices, so the in-place update needs no
synchronisation; slots not named in ``slots`` are never touched. Each
program loads the whole of q and k (the L2 norm spans Dk). Shapes as in
``reference.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _recurrent_kernel(
    q, k, v, g, beta, state, slots, out, scale,
    s_q_b, s_q_h, s_q_d, s_k_b, s_k_h, s_k_d, s_v_b, s_v_h, s_v_d,
    s_g_b, s_g_h, s_bt_b, s_bt_h,
    s_s_n, s_s_h, s_s_k, s_s_v,
    s_o_b, s_o_h, s_o_d,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    hk = h // REP
    slot = tl.load(slots + b).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    k_mask = offs_k < K
    v_mask = offs_v < V

    b_q = tl.load(q + b * s_q_b + hk * s_q_h + offs_k * s_q_d, mask=k_mask, other=0.0).to(tl.float32)
    b_k = tl.load(k + b * s_k_b + hk * s_k_h + offs_k * s_k_d, mask=k_mask, other=0.0).to(tl.float32)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 0) + 1e-6) * scale
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)
    b_v = tl.load(v + b * s_v_b + h * s_v_h + offs_v * s_v_d, mask=v_mask, other=0.0).to(tl.float32)
    b_g = tl.load(g + b * s_g_b + h * s_g_h).to(tl.float32)
    b_beta = tl.load(beta + b * s_bt_b + h * s_bt_h).to(tl.float32)

    s_mask = k_mask[:, None] & v_mask[None, :]
    p_s = state + slot * s_s_n + h * s_s_h + offs_k[:, None] * s_s_k + offs_v[None, :] * s_s_v
    b_s = tl.load(p_s, mask=s_mask, other=0.0).to(tl.float32) * tl.exp(b_g)
    mem = tl.sum(b_s * b_k[:, None], 0)
    delta = (b_v - mem) * b_beta
    b_s = b_s + b_k[:, None] * delta[None, :]
    b_o = tl.sum(b_s * b_q[:, None], 0)
    tl.store(p_s, b_s.to(state.dtype.element_ty), mask=s_mask)
    tl.store(out + b * s_o_b + h * s_o_h + offs_v * s_o_d, b_o.to(out.dtype.element_ty), mask=v_mask)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One decode step for B sequences (q, k [B, Hk, Dk], v [B, Hv, Dv], g/beta [B, Hv]).

    ``state`` [S, Hv, Dk, Dv] is read at ``slots`` [B] and updated in place.
    Returns [B, Hv, Dv] in v's dtype.
    """
    bsz, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if bsz == 0:
        return out
    bk = triton.next_power_of_2(dk)
    bv = min(32, triton.next_power_of_2(dv))
    grid = (bsz, hv, triton.cdiv(dv, bv))
    _recurrent_kernel[grid](
        q, k, v, g, beta, state, slots, out, dk ** -0.5,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *state.stride(), *out.stride(),
        REP=hv // hk, K=dk, V=dv, BK=bk, BV=bv, num_warps=4 if bk * bv >= 2048 else 1,
    )
    return out
