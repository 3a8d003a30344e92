"""Device memory of live sequences: the paged KV pool and the per-lane recurrent state.

::

    kv     : [L_full, 2, num_pages, 64, Hkv, D]   keys (0) and values (1) of every
                                                full-attention layer, paged
    ssm    : [L_lin, lanes, Hv, Dk, Dv]  fp32     delta-rule state per lane
    conv   : [L_lin, lanes, C, K - 1]             causal-conv history per lane
    slots  : retained state images, same per-lane layout, in two blocks:
             device slots (on the device) and host slots (pinned / shared memory);
             global slot id s < D is device slot s, else host slot s - D

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
    slot_ssm: tuple = ()  # (device block, host block) tensors [L_lin, n, Hv, Dk, Dv]
    slot_conv: tuple = ()
    host_blocks: tuple = ()  # HostBlock objects kept alive for the engine's life

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

    def allocate_slots(self, device_slots: int, host_slots: int) -> None:
        """Reserve the retained slots (called once at load)."""
        from engine.host_memory import HostBlock

        ssm_shape = (self.ssm.shape[0], 0, *self.ssm.shape[2:])
        conv_shape = (self.conv.shape[0], 0, *self.conv.shape[2:])
        dev = self.ssm.device

        def shape(base, n):
            return (base[0], n, *base[2:])

        d_ssm = torch.zeros(shape(ssm_shape, device_slots), dtype=self.ssm.dtype, device=dev)
        d_conv = torch.zeros(shape(conv_shape, device_slots), dtype=self.conv.dtype, device=dev)
        h_ssm = HostBlock(shape(ssm_shape, host_slots), self.ssm.dtype, dev.type, "slots-ssm")
        h_conv = HostBlock(shape(conv_shape, host_slots), self.conv.dtype, dev.type, "slots-conv")
        self.slot_ssm = (d_ssm, h_ssm.tensor)
        self.slot_conv = (d_conv, h_conv.tensor)
        self.host_blocks = (h_ssm, h_conv)

    def _slot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        d = self.slot_ssm[0].shape[1]
        block = 0 if slot < d else 1
        return self.slot_ssm[block], self.slot_conv[block], slot if block == 0 else slot - d

    def save_image(self, lane: int, slot: int) -> None:
        """Copy a lane's recurrent + conv state into a retained slot."""
        ssm, conv, i = self._slot(slot)
        ssm[:, i].copy_(self.ssm[:, lane], non_blocking=True)
        conv[:, i].copy_(self.conv[:, lane], non_blocking=True)

    def load_image(self, slot: int, lane: int) -> None:
        """Copy a retained slot's image into a lane (the slot is left as it was)."""
        ssm, conv, i = self._slot(slot)
        self.ssm[:, lane].copy_(ssm[:, i], non_blocking=True)
        self.conv[:, lane].copy_(conv[:, i], non_blocking=True)

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
