"""Device memory of live sequences: the paged KV pool and the per-lane recurrent state.

::

    kv     : bf16:     [L_full, 2, num_pages, 64, Hkv, D]  keys (0) and values (1) of
                                                        every full-attention layer, paged,
                                                        in the model dtype
             hq-e8-2b: CompressedPool
               pages  [L_full, 2, num_pages, 64, R] int16  compressed rows (kernels/hq_e8/codec.py)
               window [L_full, lanes, 2, W, Hkv, D]        exact keys/values of each lane's
                                                        last W positions, ring row = pos % W
    ssm    : [L_lin, lanes, Hv, Dk, Dv]  fp32     delta-rule state per lane
    conv   : [L_lin, lanes, C, K - 1]             causal-conv history per lane
    slots  : retained state images, same per-lane layout (ssm, conv and, for
             hq-e8-2b, the window), in two blocks: device slots (on the device)
             and host slots (pinned / shared memory); global slot id s < D is
             device slot s, else host slot s - D

The KV format is a property of the pool, fixed at allocation. ``kv[i]`` is what
full-attention layer i receives: a page tensor (bf16) or a ``CompressedLayer``.
The window is lane state, not pages: pages (shared, moved between tiers) hold
every position compressed; the image carries the window.

One tensor each, allocated and touched once at load (first-touch page faults
belong at start, not in the request path). A lane is the index of a running
sequence's state; a page is shared by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignis.engine.models.config import KV_FORMATS, PAGE_TOKENS, ModelConfig

POISON_ROW = 0x7FC0
"""int16 an hq pool is filled with when asked for NaN: as a scale it is a bf16 NaN, so reading
an unwritten row poisons the result."""


@dataclass(frozen=True)
class CompressedLayer:
    """One full-attention layer of an hq-e8-2b pool."""

    pages: torch.Tensor  # [2, num_pages, 64, R] int16
    window: torch.Tensor  # [lanes, 2, W, Hkv, D]


@dataclass(frozen=True)
class CompressedPool:
    pages: torch.Tensor  # [L_full, 2, num_pages, 64, R] int16
    window: torch.Tensor  # [L_full, lanes, 2, W, Hkv, D]

    def __getitem__(self, layer: int) -> CompressedLayer:
        return CompressedLayer(self.pages[layer], self.window[layer])


@dataclass
class ModelState:
    kv: torch.Tensor | CompressedPool
    ssm: torch.Tensor
    conv: torch.Tensor
    slot_ssm: tuple = ()  # (device block, host block) tensors [L_lin, n, Hv, Dk, Dv]
    slot_conv: tuple = ()
    slot_window: tuple = ()  # hq-e8-2b: (device block, host block) [L_full, n, 2, W, Hkv, D]
    host_blocks: tuple = ()  # HostBlock objects kept alive for the engine's life
    kv_block: object = None  # the HostBlock (CPU) or DeviceBlock (CUDA) holding the page tensor when shared
    scratch: bool = False  # the last lane and the last page are scratch (``scratch_lane``, ``scratch_page``)

    @staticmethod
    def allocate(cfg: ModelConfig, num_pages: int, lanes: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", fill: float = 0.0, kv_format: str = "bf16",
                 exact_window: int = 0, shared: bool = False, scratch: bool = False) -> "ModelState":
        """``fill`` seeds the pool (and window) so tests see reads of unwritten memory (NaN).
        ``shared``: the page tensor is memory tierd can map: named shared memory on the CPU, an
        allocation of its own with a CUDA IPC handle on CUDA (``engine.device_memory``).
        ``scratch``: one lane and one page more than asked for, which the scheduler never hands out:
        the padding rows of a captured decode graph write there (``engine.decode_graphs``)."""
        dev = torch.device(device)
        if scratch:
            num_pages, lanes = num_pages + 1, lanes + 1
        full = len(cfg.full_layers)
        kv_block = None

        def page_tensor(shape, page_dtype, value):
            nonlocal kv_block
            if shared and dev.type == "cpu":
                from ignis.engine.host_memory import HostBlock

                kv_block = HostBlock(shape, page_dtype, "cpu", "kv")
                return kv_block.tensor.fill_(value)
            if shared and dev.type == "cuda":
                from ignis.engine.device_memory import DeviceBlock

                kv_block = DeviceBlock.create(shape, page_dtype, dev)
                if kv_block is not None:
                    return kv_block.tensor.fill_(value)
            return torch.full(shape, value, dtype=page_dtype, device=dev)

        if kv_format == "bf16":
            kv = page_tensor((full, 2, num_pages, PAGE_TOKENS, cfg.num_kv_heads, cfg.head_dim), dtype, fill)
        elif kv_format == "hq-e8-2b":
            from ignis.kernels.hq_e8.codec import row_width

            if exact_window < 0:
                raise ValueError(f"--kv-exact-window must be >= 0, got {exact_window}")
            width = row_width(cfg.num_kv_heads, cfg.head_dim)
            pages = page_tensor((full, 2, num_pages, PAGE_TOKENS, width), torch.int16,
                                POISON_ROW if fill != fill else 0)
            window = torch.full((full, lanes, 2, exact_window, cfg.num_kv_heads, cfg.head_dim), fill,
                                dtype=dtype, device=dev)
            kv = CompressedPool(pages, window)
        else:
            raise ValueError(f"--kv-format: unknown format {kv_format!r} ({', '.join(KV_FORMATS)})")
        ssm = torch.zeros((len(cfg.linear_layers), lanes, cfg.linear_num_value_heads,
                           cfg.linear_key_head_dim, cfg.linear_value_head_dim), dtype=torch.float32, device=dev)
        conv = torch.zeros((len(cfg.linear_layers), lanes, cfg.conv_dim, cfg.conv_kernel - 1),
                           dtype=dtype, device=dev)
        return ModelState(kv=kv, ssm=ssm, conv=conv, kv_block=kv_block, scratch=scratch)

    def allocate_slots(self, device_slots: int, host_slots: int) -> None:
        """Reserve the retained slots (called once at load)."""
        from ignis.engine.host_memory import HostBlock

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
        win = self.window
        if win is not None and win.numel():  # an exact window of 0 tokens has nothing to keep
            win_shape = (win.shape[0], 0, *win.shape[2:])
            d_win = torch.zeros(shape(win_shape, device_slots), dtype=win.dtype, device=dev)
            h_win = HostBlock(shape(win_shape, host_slots), win.dtype, dev.type, "slots-window")
            self.slot_window = (d_win, h_win.tensor)
            self.host_blocks += (h_win,)

    def _slot(self, slot: int) -> tuple[int, int]:
        """(block, index in block) of a global slot id."""
        d = self.slot_ssm[0].shape[1]
        return (0, slot) if slot < d else (1, slot - d)

    def _image_pairs(self, lane: int, slot: int):
        """(lane part, slot part) of each state tensor: the image of ``lane`` and item ``slot``."""
        block, i = self._slot(slot)
        pairs = [(self.ssm, self.slot_ssm[block]), (self.conv, self.slot_conv[block])]
        if self.slot_window:
            pairs.append((self.window, self.slot_window[block]))
        return [(live[:, lane], slots[:, i]) for live, slots in pairs]

    @staticmethod
    def _copy_image(dst: torch.Tensor, src: torch.Tensor) -> None:
        """One strided copy on one device; across devices one contiguous copy per layer.

        A lane's (or slot's) image is one contiguous run per layer. Between the
        device and pinned host memory a strided ``copy_`` goes through a staging
        tensor; a copy per layer run is a plain DMA at the link's speed."""
        if dst.device == src.device:
            dst.copy_(src, non_blocking=True)
            return
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=True)

    def save_image(self, lane: int, slot: int) -> None:
        """Copy a lane's recurrent + conv state (and exact window) into a retained slot."""
        for live, kept in self._image_pairs(lane, slot):
            self._copy_image(kept, live)

    def keep_part(self, layer: int, part: str, lane: int, slot: int) -> None:
        """Copy one linear-attention layer's ``"ssm"`` or ``"conv"`` state of ``lane`` into a retained slot:
        the image a forward keeps part way through a chunk, layer by layer (``ForwardBatch.linear_waves``).
        An hq-e8-2b pool's exact window is lane state the forward does not keep so: it refuses."""
        if self.slot_window:
            raise ValueError("an hq-e8-2b pool keeps images only at the end of a chunk (its exact window)")
        block, i = self._slot(slot)
        live, kept = (self.ssm, self.slot_ssm[block]) if part == "ssm" else (self.conv, self.slot_conv[block])
        kept[layer, i].copy_(live[layer, lane], non_blocking=True)

    def load_image(self, slot: int, lane: int) -> None:
        """Copy a retained slot's image into a lane (the slot is left as it was)."""
        for live, kept in self._image_pairs(lane, slot):
            self._copy_image(live, kept)

    def close(self) -> None:
        """Drop every tensor, then release the blocks under them (shared memory is unlinked)."""
        blocks = (*self.host_blocks, self.kv_block)
        self.kv = self.ssm = self.conv = None
        self.slot_ssm = self.slot_conv = self.slot_window = ()
        self.host_blocks, self.kv_block = (), None
        for block in blocks:
            if block is not None:
                block.release()

    @property
    def kv_format(self) -> str:
        return "hq-e8-2b" if isinstance(self.kv, CompressedPool) else "bf16"

    @property
    def pages(self) -> torch.Tensor:
        """The page tensor of either format, [L_full, 2, num_pages, 64, ...]: what reuse and tiers move."""
        return self.kv.pages if isinstance(self.kv, CompressedPool) else self.kv

    @property
    def window(self) -> torch.Tensor | None:
        """hq-e8-2b: the exact-window rings [L_full, lanes, 2, W, Hkv, D]; bf16: None."""
        return self.kv.window if isinstance(self.kv, CompressedPool) else None

    @property
    def num_pages(self) -> int:
        """Pages the scheduler may use (the scratch page not counted)."""
        return int(self.pages.shape[2]) - int(self.scratch)

    @property
    def lanes(self) -> int:
        """Lanes the scheduler may use (the scratch lane not counted)."""
        return int(self.ssm.shape[1]) - int(self.scratch)

    @property
    def scratch_lane(self) -> int:
        if not self.scratch:
            raise ValueError("this state has no scratch lane (allocate with scratch=True)")
        return int(self.ssm.shape[1]) - 1

    @property
    def scratch_page(self) -> int:
        if not self.scratch:
            raise ValueError("this state has no scratch page (allocate with scratch=True)")
        return int(self.pages.shape[2]) - 1

    def reset_lane(self, lane: int) -> None:
        """A fresh sequence starts from zero recurrent state and zero conv history."""
        self.ssm[:, lane].zero_()
        self.conv[:, lane].zero_()

    def copy_lane(self, src: int, dst: int) -> None:
        self.ssm[:, dst].copy_(self.ssm[:, src])
        self.conv[:, dst].copy_(self.conv[:, src])
        if self.window is not None:
            self.window[:, dst].copy_(self.window[:, src])

    def copy_page(self, src: int, dst: int) -> None:
        pages = self.pages
        pages[:, :, dst].copy_(pages[:, :, src])
