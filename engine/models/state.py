"""Device memory of live sequences: the paged KV pool and the per-lane recurrent state.

::

    kv     : [L_full, 2, num_pages, 64, Hkv, D]   keys (0) and values (1) of every
                                                full-attention layer, paged
    ssm    : [L_lin, lanes, Hv, Dk, Dv]  fp32     delta-rule state per lane
    conv   : [L_lin, lanes, C, K - 1]             causal-conv history per lane

One tensor each, allocated and touched once at load (first-touch page faults
belong at start, not in the request path). A lane is the index of a running
sequence's state; a page is shared by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.config import PAGE_TOKENS, ModelConfig


@dataclass
class ModelState:
    kv: torch.Tensor
    ssm: torch.Tensor
    conv: torch.Tensor

    @staticmethod
    def allocate(cfg: ModelConfig, num_pages: int, lanes: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", fill: float = 0.0) -> "ModelState":
        dev = torch.device(device)
        kv = torch.full((len(cfg.full_layers), 2, num_pages, PAGE_TOKENS, cfg.num_kv_heads, cfg.head_dim),
                        fill, dtype=dtype, device=dev)
        ssm = torch.zeros((len(cfg.linear_layers), lanes, cfg.linear_num_value_heads,
                           cfg.linear_key_head_dim, cfg.linear_value_head_dim), dtype=torch.float32, device=dev)
        conv = torch.zeros((len(cfg.linear_layers), lanes, cfg.conv_dim, cfg.conv_kernel - 1),
                           dtype=dtype, device=dev)
        return ModelState(kv=kv, ssm=ssm, conv=conv)

    @property
    def num_pages(self) -> int:
        return int(self.kv.shape[2])

    @property
    def lanes(self) -> int:
        return int(self.ssm.shape[1])

    def reset_lane(self, lane: int) -> None:
        """A fresh sequence starts from zero recurrent state and zero conv history."""
        self.ssm[:, lane].zero_()
        self.conv[:, lane].zero_()

    def copy_lane(self, src: int, dst: int) -> None:
        self.ssm[:, dst].copy_(self.ssm[:, src])
        self.conv[:, dst].copy_(self.conv[:, src])

    def copy_page(self, src: int, dst: int) -> None:
        self.kv[:, :, dst].copy_(self.kv[:, :, src])
