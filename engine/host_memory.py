"""Host memory blocks the engine exports: pinned on CUDA, named POSIX shared memory on the CPU.

A block is allocated once at load, touched whole (first-touch page faults
belong at start), and lives until the engine exits. Its shared-memory name is
what tierd maps, on the CPU and on CUDA alike; on CUDA the same pages are also
registered as pinned memory (``cudaHostRegister``), so the engine's copies
between a lane and a host slot are DMA. Where registering fails, the block
falls back to PyTorch's own pinned memory with no name: the engine then
serves without the lower tiers.

The shared pages are reserved before they are touched
(``shared.shm_blocks.reserve_pages``): a block that does not fit in
``/dev/shm`` falls back to private memory with a warning that names the
fix, and the engine serves without the lower tiers.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import secrets
from multiprocessing import shared_memory

import torch

from ignis.shared.shm_blocks import ShmFull, reserve_pages

log = logging.getLogger("ignis.engine")

_BLOCKS: list[shared_memory.SharedMemory] = []
_SERIAL = itertools.count()


def _cleanup() -> None:
    while _BLOCKS:
        shm = _BLOCKS.pop()
        try:
            shm.close()
            shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


atexit.register(_cleanup)


class HostBlock:
    """One tensor in host memory, with the name another process can map it by (CPU)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device_type: str, tag: str):
        self.shape, self.dtype = tuple(shape), dtype
        numel = 1
        for s in shape:
            numel *= s
        nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
        self.nbytes = nbytes
        self.shm_name: str | None = None
        self._shm = None
        self._registered = 0  # address registered with CUDA as pinned
        if numel == 0:
            self.tensor = torch.zeros(shape, dtype=dtype)
            return
        # shm_blocks.ENGINE_BLOCK (reclaimable by pid); the random part: a name nobody can take first
        name = f"ignis-{os.getpid()}-{next(_SERIAL)}-{secrets.token_hex(4)}-{tag}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        _BLOCKS.append(shm)
        self._shm = shm
        self.shm_name = shm.name
        try:
            reserve_pages(shm.name, nbytes)
        except ShmFull as e:
            log.warning("the %s block cannot be shared with tierd, so the lower tiers are off: %s", tag, e)
            self._make_private(pinned=device_type == "cuda")
            return
        flat = torch.frombuffer(shm.buf, dtype=torch.uint8, count=nbytes)
        flat.zero_()  # touch every page now
        self.tensor = flat.view(dtype)[:numel].view(shape)
        if device_type == "cuda" and not self._pin(flat):
            del flat
            self._make_private(pinned=True)

    def _make_private(self, pinned: bool) -> None:
        """Give up the shared memory for memory of this process alone (tierd cannot reach the block)."""
        self.release()
        self.shm_name = None
        self.tensor = torch.zeros(self.shape, dtype=self.dtype, pin_memory=pinned)

    def _pin(self, flat: torch.Tensor) -> bool:
        """Register the shared pages with CUDA as pinned host memory."""
        cudart = torch.cuda.cudart()
        ptr = flat.data_ptr()
        err = cudart.cudaHostRegister(ptr, flat.numel(), 0)
        if int(err) != 0:
            log.warning("cudaHostRegister of %d bytes of shared memory failed (error %s): this host block is "
                        "pinned but not shared with tierd", flat.numel(), err)
            return False
        self._registered = ptr
        return True

    def release(self) -> None:
        """Drop the tensor and unlink the shared memory now (the engine is unloading)."""
        self.tensor = None
        if self._registered:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = 0
        shm, self._shm = self._shm, None
        if shm is None:
            return
        if shm in _BLOCKS:
            _BLOCKS.remove(shm)
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
        try:
            shm.close()
        except BufferError:
            pass  # views still alive: the mapping goes when they do; the name is gone already

