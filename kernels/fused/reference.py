"""Torch twins of the fused ops: the model's own torch math, one chain each.

Shapes (any leading dims unless stated; norms run over the last dim)::

    rms_norm(x, weight, eps)                 zero-centred RMSNorm: x_hat * (1 + w), fp32 math
    add_rms_norm(x, residual, weight, eps)   -> (residual + x, rms_norm(residual + x))
    gated_rms_norm(x, gate, weight, eps)     w * x_hat (in x's dtype) * silu(gate)
    norm_rotary(x, weight, cos, sin, eps)    x [T, H, D]: rms_norm per head, then the half-split
                                             rotary on the first R channels; cos/sin [T, R]
    silu_mul(gate, up)                       silu(gate) * up
    sigmoid_mul(x, gate)                     x * sigmoid(gate)
    gdn_gating(a, b, A_log, dt_bias)         a, b [T, Hv] -> (g fp32, beta in b's dtype):
                                             g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).type_as(x)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual = residual + x
    return residual, rms_norm(residual, weight, eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * xf.to(dtype)
    return (y * F.silu(gate.float())).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def norm_rotary(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                eps: float) -> torch.Tensor:
    x = rms_norm(x, weight, eps)
    r = cos.shape[-1]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * c + _rotate_half(rot) * s, rest], dim=-1)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, beta
