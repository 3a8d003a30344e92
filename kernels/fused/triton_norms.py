"""Triton forms of the fused norms: one program per row (token, or token x head), fp32 math.

Inputs are ``[..., D]`` with unit stride along D; a 3-D ``[T, H, D]`` input
may have any T and H strides (a head slice of a wider projection), other
shapes are flattened to rows. Outputs are contiguous, in the input's dtype.
``add_rms_norm`` rounds the sum to the residual's dtype before normalising,
as the twin does; ``gated_rms_norm`` rounds the normalised row to x's dtype
before the weight, as the twin does. ``norm_rotary`` normalises each head and
rotates its first R channels (R = cos.shape[-1]) with the half-split rule:
for d < R/2, out[d] = n[d] cos[d] - n[d + R/2] sin[d], and
out[d + R/2] = n[d + R/2] cos[d + R/2] + n[d] sin[d + R/2].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [T, H, D] with unit stride along D (a view where it can be)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() > 3:
        return x.reshape(-1, x.shape[-2], x.shape[-1])
    return x


def _block(d: int) -> tuple[int, int]:
    block = triton.next_power_of_2(d)
    return block, min(16, max(1, block // 256))


@triton.jit
def _row_place(H, D, BLOCK: tl.constexpr):
    """This program's row of [tokens x H] rows, its token and head, the channel offsets and their mask."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    return row, row // H, row % H, d, d < D


@triton.jit
def _rstd(vf, D, eps):
    """1 / RMS of a row held in fp32 (its masked tail zeros)."""
    return tl.rsqrt(tl.sum(vf * vf, 0) / D + eps)


@triton.jit
def _rms_norm_kernel(x, res, w, out, res_out, H, s_xt, s_xh, s_rt, s_rh, D, eps,
                     ADD: tl.constexpr, BLOCK: tl.constexpr):
    row, t, h, d, m = _row_place(H, D, BLOCK)
    v = tl.load(x + t * s_xt + h * s_xh + d, mask=m, other=0.0)
    if ADD:
        r = tl.load(res + t * s_rt + h * s_rh + d, mask=m, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(res_out.dtype.element_ty)
        tl.store(res_out + row * D + d, v, mask=m)
    vf = v.to(tl.float32)
    rstd = _rstd(vf, D, eps)
    wf = tl.load(w + d, mask=m, other=0.0).to(tl.float32)
    tl.store(out + row * D + d, (vf * rstd * (1.0 + wf)).to(out.dtype.element_ty), mask=m)


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    shape, d = x.shape, x.shape[-1]
    x3 = _rows(x)
    r3 = _rows(residual) if residual is not None else x3
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(shape, dtype=residual.dtype, device=x.device) if residual is not None else out
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block, warps = _block(d)
        _rms_norm_kernel[(rows,)](x3, r3, weight, out, res_out, x3.shape[1], x3.stride(0), x3.stride(1),
                                  r3.stride(0), r3.stride(1), d, eps, ADD=residual is not None, BLOCK=block,
                                  num_warps=warps)
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _norm(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != residual.shape:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    out, res_out = _norm(x, residual, weight, eps)
    return res_out, out


@triton.jit
def _gated_norm_kernel(x, gate, w, out, H, s_xt, s_xh, s_gt, s_gh, D, eps, BLOCK: tl.constexpr):
    row, t, h, d, m = _row_place(H, D, BLOCK)
    v = tl.load(x + t * s_xt + h * s_xh + d, mask=m, other=0.0)
    vf = v.to(tl.float32)
    rstd = _rstd(vf, D, eps)
    n = (vf * rstd).to(v.dtype).to(tl.float32)
    wf = tl.load(w + d, mask=m, other=0.0).to(tl.float32)
    g = tl.load(gate + t * s_gt + h * s_gh + d, mask=m, other=0.0).to(tl.float32)
    tl.store(out + row * D + d, (wf * n * g * tl.sigmoid(g)).to(out.dtype.element_ty), mask=m)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.shape != gate.shape:
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)} and gate {tuple(gate.shape)} differ")
    d = x.shape[-1]
    x3, g3 = _rows(x), _rows(gate)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block, warps = _block(d)
        _gated_norm_kernel[(rows,)](x3, g3, weight, out, x3.shape[1], x3.stride(0), x3.stride(1), g3.stride(0),
                                    g3.stride(1), d, eps, BLOCK=block, num_warps=warps)
    return out


@triton.jit
def _norm_rotary_kernel(x, w, cos, sin, out, H, s_xt, s_xh, s_ct, s_st, D, eps,
                        R: tl.constexpr, BLOCK: tl.constexpr):
    row, t, h, d, m = _row_place(H, D, BLOCK)
    base = x + t * s_xt + h * s_xh
    vf = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
    rstd = _rstd(vf, D, eps)
    n = vf * rstd * (1.0 + tl.load(w + d, mask=m, other=0.0).to(tl.float32))
    # the partner channel of the rotation, normalised the same way
    rot = d < R
    half = R // 2
    p = tl.where(d < half, d + half, d - half)
    pv = tl.load(base + p, mask=rot, other=0.0).to(tl.float32)
    pn = pv * rstd * (1.0 + tl.load(w + p, mask=rot, other=0.0).to(tl.float32))
    c = tl.load(cos + t * s_ct + d, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin + t * s_st + d, mask=rot, other=0.0).to(tl.float32)
    sign = tl.where(d < half, -1.0, 1.0)
    y = tl.where(rot, n * c + sign * pn * s, n)
    tl.store(out + row * D + d, y.to(out.dtype.element_ty), mask=m)


def norm_rotary(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                eps: float) -> torch.Tensor:
    if x.dim() != 3:
        raise ValueError(f"norm_rotary: x must be [T, H, D], got {tuple(x.shape)}")
    t, h, d = x.shape
    r = cos.shape[-1]
    if cos.shape != (t, r) or sin.shape != (t, r) or r > d or r % 2:
        raise ValueError(f"norm_rotary: cos/sin must be [T, R] with even R <= D; got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)} for x {tuple(x.shape)}")
    x3 = _rows(x)
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if t * h:
        block, warps = _block(d)
        _norm_rotary_kernel[(t * h,)](x3, weight, cos, sin, out, h, x3.stride(0), x3.stride(1), cos.stride(0),
                                      sin.stride(0), d, eps, R=r, BLOCK=block, num_warps=warps)
    return out
