"""Triton forms of the depthwise causal conv1d + SiLU: varlen prefill and one-step update.

Layouts as in ``reference.py``::

    x          : [T, C] packed varlen (prefill) or [B, C] (one step), any strides
    weight     : [C, K]
    conv_state : [S, C, K - 1]   per-slot history, oldest column first

    xx = | hist_0 ... hist_{K-2} | x_0 x_1 ... x_{n-1} |      (per channel)
    y_t = silu(sum_j weight[:, j] * xx[t + j]);   new hist = xx[n : n + K - 1]

``causal_conv1d_varlen``: one program per (sequence, block of ``BC``
channels, block of ``BT`` tokens), fp32 accumulation. A token tile reads x
only (tokens t >= K - 1); the first tile's program also computes the first
K - 1 tokens, which read the old history, from a small ``[K-1, BC]`` tile,
and then writes the new history after a barrier, so no program reads a
history another has already replaced. ``causal_conv1d_update``: one program per
(sequence, channel block) shifts the history by one column in place. Slots
not named in ``slots`` are never touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_varlen_kernel(
    x, weight, conv_state, slots, cu_seqlens, out,
    s_x_t, s_x_c, s_w_c, s_w_k, s_cs_n, s_cs_c, s_cs_k, s_o_t, s_o_c,
    C, KW: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BKW: tl.constexpr,
):
    b = tl.program_id(0)
    ic = tl.program_id(1)
    it = tl.program_id(2)
    bos = tl.load(cu_seqlens + b).to(tl.int64)
    n = tl.load(cu_seqlens + b + 1).to(tl.int64) - bos
    t0 = it * BT
    if t0 < n:
        offs_c = ic * BC + tl.arange(0, BC)
        c_mask = offs_c < C
        # tokens t >= K - 1 read x only: the [BT, BC] tile
        offs_t = t0 + tl.arange(0, BT)
        t_mask = offs_t < n
        acc = tl.zeros([BT, BC], dtype=tl.float32)
        for j in tl.static_range(KW):
            idx = offs_t + (j - (KW - 1))
            m = (t_mask & (idx >= 0))[:, None] & c_mask[None, :]
            xv = tl.load(x + (bos + idx)[:, None] * s_x_t + offs_c[None, :] * s_x_c, mask=m, other=0.0)
            w_j = tl.load(weight + offs_c * s_w_c + j * s_w_k, mask=c_mask, other=0.0).to(tl.float32)
            acc += xv.to(tl.float32) * w_j[None, :]
        y = acc * tl.sigmoid(acc)
        o_mask = (t_mask & (offs_t >= KW - 1))[:, None] & c_mask[None, :]
        tl.store(out + (bos + offs_t)[:, None] * s_o_t + offs_c[None, :] * s_o_c, y.to(out.dtype.element_ty),
                 mask=o_mask)
        if it == 0:
            slot = tl.load(slots + b).to(tl.int64)
            hist = conv_state + slot * s_cs_n
            # tokens t < K - 1 also read the old history: xx[i] = hist[i] (i < K-1) or x[i - (K-1)]
            offs_r = tl.arange(0, BKW)
            r_mask = (offs_r < KW - 1) & (offs_r < n)
            acc_h = tl.zeros([BKW, BC], dtype=tl.float32)
            for j in tl.static_range(KW):
                i = offs_r + j
                in_h = (r_mask & (i < KW - 1))[:, None] & c_mask[None, :]
                in_x = (r_mask & (i >= KW - 1))[:, None] & c_mask[None, :]
                head_h = tl.load(hist + offs_c[None, :] * s_cs_c + i[:, None] * s_cs_k, mask=in_h, other=0.0)
                head_x = tl.load(x + (bos + i - (KW - 1))[:, None] * s_x_t + offs_c[None, :] * s_x_c, mask=in_x,
                                 other=0.0)
                head_w = tl.load(weight + offs_c * s_w_c + j * s_w_k, mask=c_mask, other=0.0).to(tl.float32)
                acc_h += (head_h.to(tl.float32) + head_x.to(tl.float32)) * head_w[None, :]
            y_h = acc_h * tl.sigmoid(acc_h)
            tl.store(out + (bos + offs_r)[:, None] * s_o_t + offs_c[None, :] * s_o_c, y_h.to(out.dtype.element_ty),
                     mask=r_mask[:, None] & c_mask[None, :])
            # new history column i = xx[n + i]: x[n + i - (K-1)] or old column n + i
            offs_w = tl.arange(0, BKW)
            idx_w = n + offs_w - (KW - 1)
            w_mask = offs_w < KW - 1
            new_in_x = c_mask[:, None] & (w_mask & (idx_w >= 0))[None, :]
            new_in_h = c_mask[:, None] & (w_mask & (idx_w < 0))[None, :]
            new_x = tl.load(x + (bos + idx_w)[None, :] * s_x_t + offs_c[:, None] * s_x_c, mask=new_in_x, other=0.0)
            new_h = tl.load(hist + offs_c[:, None] * s_cs_c + (n + offs_w)[None, :] * s_cs_k, mask=new_in_h,
                            other=0.0)
            new = new_x.to(weight.dtype.element_ty) + new_h.to(weight.dtype.element_ty)
            tl.debug_barrier()  # every read of the old history above happens before it is replaced
            tl.store(hist + offs_c[:, None] * s_cs_c + offs_w[None, :] * s_cs_k,
                     new.to(conv_state.dtype.element_ty), mask=c_mask[:, None] & w_mask[None, :])


@triton.jit
def _conv_update_kernel(
    x, weight, conv_state, slots, out,
    s_x_b, s_x_c, s_w_c, s_w_k, s_cs_n, s_cs_c, s_cs_k, s_o_b, s_o_c,
    C, KW: tl.constexpr, BC: tl.constexpr, BKW: tl.constexpr,
):
    b = tl.program_id(0)
    ic = tl.program_id(1)
    slot = tl.load(slots + b).to(tl.int64)
    hist = conv_state + slot * s_cs_n
    offs_c = ic * BC + tl.arange(0, BC)
    offs_w = tl.arange(0, BKW)
    c_mask = offs_c < C
    w_mask = offs_w < KW - 1
    m2 = c_mask[:, None] & w_mask[None, :]
    xv = tl.load(x + b * s_x_b + offs_c * s_x_c, mask=c_mask, other=0.0)
    hv = tl.load(hist + offs_c[:, None] * s_cs_c + offs_w[None, :] * s_cs_k, mask=m2, other=0.0)
    w_h = tl.load(weight + offs_c[:, None] * s_w_c + offs_w[None, :] * s_w_k, mask=m2, other=0.0)
    w_x = tl.load(weight + offs_c * s_w_c + (KW - 1) * s_w_k, mask=c_mask, other=0.0)
    acc = tl.sum(hv.to(tl.float32) * w_h.to(tl.float32), 1) + xv.to(tl.float32) * w_x.to(tl.float32)
    tl.store(out + b * s_o_b + offs_c * s_o_c, (acc * tl.sigmoid(acc)).to(out.dtype.element_ty), mask=c_mask)
    # shifted history: column i <- old column i + 1, the last column <- x
    m_shift = c_mask[:, None] & (offs_w + 1 < KW - 1)[None, :]
    shifted = tl.load(hist + offs_c[:, None] * s_cs_c + (offs_w + 1)[None, :] * s_cs_k, mask=m_shift, other=0.0)
    new = tl.where((offs_w == KW - 2)[None, :], xv.to(weight.dtype.element_ty)[:, None],
                   shifted.to(weight.dtype.element_ty))
    tl.debug_barrier()
    tl.store(hist + offs_c[:, None] * s_cs_c + offs_w[None, :] * s_cs_k, new.to(conv_state.dtype.element_ty), mask=m2)


def _check_taps(weight: torch.Tensor, conv_state: torch.Tensor) -> int:
    taps = weight.shape[1]
    if taps < 2 or conv_state.shape[-1] != taps - 1:
        raise ValueError(f"conv_state needs K - 1 = {taps - 1} columns (K >= 2), got {conv_state.shape[-1]}")
    return taps


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Prefill chunks of B sequences (x [T, C]) from their histories; histories updated in place."""
    taps = _check_taps(weight, conv_state)
    total, channels = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    bsz = slots.shape[0]
    if total == 0 or bsz == 0:
        return out
    max_n = total  # bounds the longest chunk with no read from the device; tiles past a chunk's end return
    on_cpu = x.device.type == "cpu"
    bt, bc = (16, 32) if on_cpu else (64, 128)
    bt = max(bt, triton.next_power_of_2(taps - 1))
    grid = (bsz, triton.cdiv(channels, bc), triton.cdiv(max_n, bt))
    _conv_varlen_kernel[grid](
        x, weight, conv_state, slots, cu_seqlens, out,
        *x.stride(), *weight.stride(), *conv_state.stride(), *out.stride(),
        channels, KW=taps, BT=bt, BC=bc, BKW=triton.next_power_of_2(taps - 1), num_warps=4,
    )
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One step for B sequences (x [B, C]); histories shifted in place."""
    taps = _check_taps(weight, conv_state)
    bsz, channels = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if bsz == 0:
        return out
    bc = 32 if x.device.type == "cpu" else 256
    _conv_update_kernel[(bsz, triton.cdiv(channels, bc))](
        x, weight, conv_state, slots, out,
        *x.stride(), *weight.stride(), *conv_state.stride(), *out.stride(),
        channels, KW=taps, BC=bc, BKW=triton.next_power_of_2(taps - 1), num_warps=4,
    )
    return out
