"""Sparse mixture of experts (Qwen3-Next): top-k router plus a sigmoid-gated shared expert.

Expert weights are stacked::

    experts.gate_up_proj : [E, 2I, H]   rows 0..I-1 gate, I..2I-1 up
    experts.down_proj    : [E, H, I]

The router's softmax runs in fp32; with ``norm_topk_prob`` the chosen k
weights are renormalised to sum to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ignis.engine.models.config import ModelConfig
from ignis.engine.models.layers import SwiGLU


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H]; experts/weights [N, k] -> [N, H]; only the experts hit are run."""
        out = torch.zeros_like(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.gate_up_proj.shape[0]).tolist()
        token_of = order // experts.shape[1]
        w_of = weights.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            tok = token_of[start:start + n]
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * w_of[start:start + n, None]
            out.index_add_(0, tok, y.to(out.dtype))
            start += n
        return out


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = StackedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_w, top_e = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        routed = self.experts(x, top_e, top_w.to(logits.dtype))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared
