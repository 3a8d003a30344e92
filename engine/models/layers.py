"""Small building blocks shared by both families: norms, rotary embedding, SwiGLU MLP, embeddings.

The modules hold the weights; their math is an ``Ops`` call (kernels/backend.py),
so each forward takes the model's ``ops`` record like the attention and
delta-rule layers do.
"""

from __future__ import annotations

import torch
from torch import nn

from ignis.engine.models.yarn import Yarn
from ignis.kernels.backend import REFERENCE, Ops


def embedding(num: int, dim: int) -> nn.Embedding:
    """``nn.Embedding(num, dim)``, initialised the way torch does it (standard normal), except on the meta
    device, where it is left uninitialised: there torch's ``normal_`` imports ``torch._dynamo``, seconds
    of every engine start, for values that the checkpoint's tensors replace anyway (``models.build``)."""
    weight = torch.empty(num, dim)
    if not weight.is_meta:
        nn.init.normal_(weight)
    return nn.Embedding(num, dim, _weight=weight)


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from one: ``x_hat * (1 + w)``, in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor, ops: Ops) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add fused with this norm: -> (residual + x, norm(residual + x))."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: Ops) -> torch.Tensor:
        """Per-head norm of x [T, H, D], then the partial rotary embedding (cos/sin [T, rotary_dim])."""
        return ops.norm_rotary(x, self.weight, cos, sin, self.eps)


class GatedRMSNorm(nn.Module):
    """RMSNorm of the delta-rule output, scaled by ``w`` and gated by ``silu(z)``."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor, ops: Ops) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


class PartialRotary(nn.Module):
    """Rotary tables for the first ``rotary_dim`` channels of each head (half-split form), YaRN-scaled when
    the config asks (``engine.models.yarn``).

    The rotation itself runs fused with the q/k norm (``ZeroCenteredRMSNorm.rotary``).
    """

    def __init__(self, rotary_dim: int, theta: float, yarn: Yarn | None = None):
        super().__init__()
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.yarn = yarn
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self, device: torch.device | str = "cpu") -> torch.Tensor:
        if self.yarn is not None:
            return self.yarn.inv_freq(self.rotary_dim, self.theta, device)
        steps = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.theta ** (steps / self.rotary_dim))

    def _tables(self, emb: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = emb.cos(), emb.sin()
        if self.yarn is not None and self.yarn.attention_factor != 1.0:
            cos, sin = cos * self.yarn.attention_factor, sin * self.yarn.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)
        return self._tables(torch.cat([freqs, freqs], dim=-1), dtype)

    def mrope_cos_sin(self, positions: torch.Tensor, section: tuple[int, int, int],
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for (t, h, w) positions [3, T], the sections interleaved over the frequencies:
        frequency ``i`` turns with h where ``i % 3 == 1`` and ``i < 3 * section[1]``, with w where
        ``i % 3 == 2`` and ``i < 3 * section[2]``, with t elsewhere (transformers' Qwen3.5 layout).
        Where t = h = w this is ``cos_sin`` exactly."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)  # [3, T, F]
        mixed = freqs[0].clone()
        for axis in (1, 2):
            picked = slice(axis, 3 * section[axis], 3)
            mixed[..., picked] = freqs[axis][..., picked]
        return self._tables(torch.cat([mixed, mixed], dim=-1), dtype)


class SwiGLU(nn.Module):
    """Dense MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, ops: Ops = REFERENCE) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x)))
