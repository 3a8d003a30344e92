"""Torch twins of the depthwise causal conv1d (+ SiLU) used by Gated DeltaNet.

Shapes::

    x          : [T, C]           packed varlen tokens (prefill) or [B, C] (one step)
    weight     : [C, K]           depthwise kernel, K taps, no bias
    conv_state : [S, C, K - 1]    per-sequence history: the last K-1 inputs,
                                  oldest first; addressed by ``slots`` [B]
    cu_seqlens : [B + 1]

Output token t of a sequence is ``silu(sum_j weight[:, j] * xx[t + j])`` over
``xx = concat(history, x)``; afterwards the history holds the last K-1
columns of ``xx``. A fresh sequence starts from a zero history.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Prefill chunks of B sequences from their histories; histories updated in place."""
    channels, taps = weight.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    w = weight.unsqueeze(1)
    cu = cu_seqlens.tolist()
    slot_list = slots.tolist()
    by_length: dict[int, list[int]] = {}  # sequences of one length run as one batched conv
    for b in range(len(slot_list)):
        if cu[b + 1] > cu[b]:
            by_length.setdefault(cu[b + 1] - cu[b], []).append(b)
    for n, group in by_length.items():
        idx = torch.tensor([slot_list[b] for b in group], device=x.device)
        if len(group) == 1:  # one sequence: its rows are a slice (no gather, no scatter)
            rows = slice(cu[group[0]], cu[group[0]] + n)
        else:
            rows = (torch.tensor([cu[b] for b in group], device=x.device).unsqueeze(1)
                    + torch.arange(n, device=x.device)).reshape(-1)
        seqs = x[rows].view(len(group), n, channels).transpose(1, 2)  # [B, C, n]
        xx = torch.cat([conv_state[idx].to(weight.dtype), seqs.to(weight.dtype)], dim=-1)
        y = F.conv1d(xx, w, groups=channels)  # [B, C, n]
        out[rows] = F.silu(y).transpose(1, 2).reshape(-1, channels).to(x.dtype)
        conv_state[idx] = xx[:, :, -(taps - 1):].to(conv_state.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One step for B sequences (x [B, C]); histories shifted in place. Computed by the same ``F.conv1d`` as
    the prefill (as transformers' decode step is): in bf16 a product-then-sum rounds each product first, so
    a token computed as a one-token step came out unlike the same token in a prefill, and a resumed prompt
    (whose last piece is often one token) unlike its cold run."""
    idx = slots.long()
    hist = conv_state[idx].to(weight.dtype)  # [B, C, K-1]
    xx = torch.cat([hist, x.to(weight.dtype).unsqueeze(-1)], dim=-1)  # [B, C, K]
    y = F.conv1d(xx, weight.unsqueeze(1), groups=weight.shape[0])[..., -1]  # [B, C]
    conv_state[idx] = xx[:, :, 1:].to(conv_state.dtype)
    return F.silu(y).to(x.dtype)
