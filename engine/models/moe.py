"""Sparse mixture of experts (Qwen3-Next): top-k router plus a sigmoid-gated shared expert.

Expert weights are stacked::

    experts.gate_up_proj : [E, 2I, H]   rows 0..I-1 gate, I..2I-1 up
    experts.down_proj    : [E, H, I]

The router's softmax runs in fp32; with ``norm_topk_prob`` the chosen k
weights are renormalised to sum to one.

``StackedExperts`` runs the routed experts grouped, with no Python loop over
experts: each of the N*k (token, expert) pairs gets its expert's SwiGLU
output in one of the three forms below; then every pair is multiplied by its
routing weight (in the weights' dtype) and each token's k pairs are summed in
top-k order, a fixed order, so the result is deterministic.

* Grouped GEMM (``torch._grouped_mm``): the pairs are sorted by expert on
  the device, the per-expert end offsets come from a ``searchsorted`` over
  the sorted ids, and gate_up and down are one grouped GEMM each. Used on
  CUDA for bf16 on sm90 (the kernel of torch >= 2.8; no host sync, so
  CUDA-graph safe) and on CPU from torch 2.9, both only when H and I rows
  are multiples of 16 bytes.
* Gathered bmm, where the grouped GEMM is not used and there are at most
  ``DECODE_PAIRS`` pairs (decode): each pair's expert weights are gathered
  and one ``bmm`` runs per projection. No host sync: CUDA-graph safe. The
  gather copies k experts' weights per token, hence the bound.
* Padded bmm, where the grouped GEMM is not used and there are more pairs
  (prefill): the sorted pairs are scattered into an [E, C, H] block, C the
  largest group (at most N, since a token's k experts are distinct), and one
  ``bmm`` per projection runs over the stacked weights. Reading C is the
  layer's one host sync, so this form never runs inside a CUDA graph.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.torch_version import TorchVersion

from ignis.engine.models.config import ModelConfig
from ignis.engine.models.layers import SwiGLU
from ignis.kernels.backend import REFERENCE, Ops

DECODE_PAIRS = 64
"""Largest number of (token, expert) pairs run by the gathered bmm."""

_TORCH = TorchVersion(torch.__version__)


@functools.lru_cache(maxsize=None)
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def grouped_mm_ok(x: torch.Tensor, inter: int) -> bool:
    """Whether ``torch._grouped_mm`` runs the experts for ``x`` without a host sync."""
    return grouped_mm_runs(x.dtype, x.device, x.shape[-1], inter)


def grouped_mm_runs(dtype: torch.dtype, device: torch.device, hidden: int, inter: int) -> bool:
    """Whether ``torch._grouped_mm`` runs experts of these sizes for activations of ``dtype`` on ``device``."""
    size = torch.empty((), dtype=dtype).element_size()
    if not hasattr(torch, "_grouped_mm") or (hidden * size) % 16 or (inter * size) % 16:
        return False
    if device.type == "cuda":
        return dtype == torch.bfloat16 and _sm90(device.index if device.index is not None
                                                else torch.cuda.current_device())
    return device.type == "cpu" and _TORCH >= (2, 9)


def sort_pairs(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert, on the device: (sorted expert ids, pair order, int32 end offset of each expert)."""
    sorted_e, order = torch.sort(experts.reshape(-1), stable=True)
    ids = torch.arange(num_experts, device=experts.device, dtype=sorted_e.dtype)
    return sorted_e, order, torch.searchsorted(sorted_e, ids, right=True, out_int32=True)


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H]; experts/weights [N, k] -> [N, H]: sum over k of weight * expert(x)."""
        n, k = experts.shape
        if n == 0:
            return torch.zeros_like(x)
        if grouped_mm_ok(x, self.down_proj.shape[-1]):
            y = self.grouped(x, experts)
        elif n * k <= DECODE_PAIRS:
            y = self.gathered(x, experts)
        else:
            y = self.padded(x, experts)
        return (y.view(n, k, -1) * weights[..., None]).sum(1).to(x.dtype)

    def grouped(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """[N*k, H] expert outputs in pair order, by one grouped GEMM per projection."""
        _, order, ends = sort_pairs(experts, self.gate_up_proj.shape[0])
        h = torch._grouped_mm(x[order // experts.shape[1]], self.gate_up_proj.transpose(1, 2), offs=ends)
        y = torch._grouped_mm(_swiglu(h), self.down_proj.transpose(1, 2), offs=ends)
        return torch.empty_like(y).index_copy_(0, order, y)

    def gathered(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """[N*k, H] expert outputs in pair order, by one bmm per projection over gathered expert weights."""
        flat = experts.reshape(-1)
        rows = x.repeat_interleave(experts.shape[1], dim=0).unsqueeze(1)
        h = torch.bmm(rows, self.gate_up_proj[flat].transpose(1, 2))
        return torch.bmm(_swiglu(h), self.down_proj[flat].transpose(1, 2)).squeeze(1)

    def padded(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """[N*k, H] expert outputs in pair order, by one bmm per projection over [E, C] padded groups.

        Reads the largest group size C on the host: one sync per call.
        """
        num_experts = self.gate_up_proj.shape[0]
        sorted_e, order, ends = sort_pairs(experts, num_experts)
        ends = ends.long()
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        slot = torch.arange(order.numel(), device=x.device) - (ends - counts)[sorted_e]
        block = x.new_zeros(num_experts, int(counts.max()), x.shape[1])
        block[sorted_e, slot] = x[order // experts.shape[1]]
        h = torch.bmm(block, self.gate_up_proj.transpose(1, 2))
        y = torch.bmm(_swiglu(h), self.down_proj.transpose(1, 2))[sorted_e, slot]
        return torch.empty_like(y).index_copy_(0, order, y)


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = StackedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def sync_free_tokens(self, dtype: torch.dtype, device: torch.device) -> int | None:
        """The most tokens this layer takes without waiting on the host (None: any number).

        Beyond ``DECODE_PAIRS // top_k`` tokens, where the grouped GEMM does not
        run, the padded form reads its group size on the host: a CUDA graph
        cannot hold that forward.
        """
        experts = self.experts
        if grouped_mm_runs(dtype, device, experts.down_proj.shape[1], experts.down_proj.shape[2]):
            return None
        return DECODE_PAIRS // self.top_k

    def forward(self, x: torch.Tensor, ops: Ops = REFERENCE) -> torch.Tensor:
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_w, top_e = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        routed = self.experts(x, top_e, top_w.to(logits.dtype))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, ops)
        return routed + shared
