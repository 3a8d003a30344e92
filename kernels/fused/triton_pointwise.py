"""Triton forms of the fused gates: ``silu_mul``, ``sigmoid_mul`` and ``gdn_gating``, fp32 math.

``silu_mul`` / ``sigmoid_mul`` take two tensors of one shape, each a 2-D
``[T, N]`` or 3-D ``[T, H, N]`` view with unit stride along N (any T and H
strides; other shapes are made contiguous), and write a contiguous result:
one program per (row, block of ``BN`` channels). ``gdn_gating`` runs one
program per token over the Hv value heads and writes g (fp32) and beta
(b's dtype); softplus is linear above 20, as torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BN = 1024


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1 or x.dim() > 3:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(-1, x.shape[-2], x.shape[-1]) if x.dim() > 3 else x


@triton.jit
def _gate_mul_kernel(a, b, out, H, s_at, s_ah, s_bt, s_bh, N, SILU_A: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = row // H
    h = row % H
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = n < N
    av = tl.load(a + t * s_at + h * s_ah + n, mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + t * s_bt + h * s_bh + n, mask=m, other=0.0).to(tl.float32)
    if SILU_A:
        y = av * tl.sigmoid(av) * bv
    else:
        y = av * tl.sigmoid(bv)
    tl.store(out + row * N + n, y.to(out.dtype.element_ty), mask=m)


def _gate_mul(a: torch.Tensor, b: torch.Tensor, silu_a: bool, what: str) -> torch.Tensor:
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    a3, b3 = _rows(a), _rows(b)
    out = torch.empty(a.shape, dtype=torch.result_type(a, b), device=a.device)
    rows, n = a3.shape[0] * a3.shape[1], a3.shape[2]
    if rows and n:
        block = min(BN, triton.next_power_of_2(n))
        _gate_mul_kernel[(rows, triton.cdiv(n, block))](a3, b3, out, a3.shape[1], a3.stride(0), a3.stride(1),
                                                         b3.stride(0), b3.stride(1), n, SILU_A=silu_a,
                                                         BLOCK=block, num_warps=4)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _gate_mul(gate, up, True, "silu_mul")


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return _gate_mul(x, gate, False, "sigmoid_mul")


@triton.jit
def _gdn_gating_kernel(a, b, A_log, dt_bias, g, beta, s_at, s_ah, s_bt, s_bh, HV, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK)
    m = h < HV
    av = tl.load(a + t * s_at + h * s_ah, mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + t * s_bt + h * s_bh, mask=m, other=0.0).to(tl.float32)
    x = av + tl.load(dt_bias + h, mask=m, other=0.0).to(tl.float32)
    # log1p(e^x) by Kahan's identity: log(1 + y) alone loses y's digits once 1 + y rounds (x below about -9:
    # the relative error of g reached 1e-4 at -9, and g was 0 below -20)
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    softplus = tl.where(x > 20.0, x, tl.where(u == 1.0, y, tl.log(u) * (y / (u - 1.0))))
    decay = -tl.exp(tl.load(A_log + h, mask=m, other=0.0).to(tl.float32)) * softplus
    tl.store(g + t * HV + h, decay, mask=m)
    tl.store(beta + t * HV + h, tl.sigmoid(bv).to(beta.dtype.element_ty), mask=m)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if a.dim() != 2 or a.shape != b.shape or A_log.shape != (a.shape[1],) or dt_bias.shape != A_log.shape:
        raise ValueError(f"gdn_gating: expected a, b [T, Hv] and A_log, dt_bias [Hv]; got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(A_log.shape)}, {tuple(dt_bias.shape)}")
    t, hv = a.shape
    g = torch.empty((t, hv), dtype=torch.float32, device=a.device)
    beta = torch.empty((t, hv), dtype=b.dtype, device=a.device)
    if t:
        _gdn_gating_kernel[(t,)](a, b, A_log, dt_bias, g, beta, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                 hv, BLOCK=triton.next_power_of_2(hv), num_warps=1)
    return g, beta
