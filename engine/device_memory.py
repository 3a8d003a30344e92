"""Device memory the engine exports to tierd on CUDA: one allocation per block, shared by CUDA IPC handle.

tierd copies KV pages between the engine's pool and its arena itself, so the
pool must be memory another process can open. PyTorch's caching allocator
hands out pieces of larger segments, and an IPC handle opens at the start of
a segment, not of a piece; the pool is therefore allocated on its own with
``cudaMalloc`` (through cupy, the ``cuda`` extra) and wrapped as a torch
tensor with DLPack, so the handle opens exactly at the tensor's first byte.

``DeviceBlock.create`` returns None when the memory cannot be exported (no
cupy, or the allocation fails): the engine then allocates the pool the plain
way and runs with the device tier alone.
"""

from __future__ import annotations

import logging
import math

import torch

log = logging.getLogger("ignis.engine")


class DeviceBlock:
    """One exported CUDA allocation seen as a torch tensor of ``shape`` and ``dtype``."""

    def __init__(self, tensor: torch.Tensor, ptr: int, handle: bytes, device: int, runtime):
        self.tensor = tensor
        self.shape = tuple(tensor.shape)
        self.device = device
        self.ipc_handle = handle.hex()
        self.shm_name = None
        self._ptr = ptr
        self._runtime = runtime

    @classmethod
    def create(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> DeviceBlock | None:
        try:
            import cupy  # noqa: PLC0415 - CUDA path only
        except ImportError:
            log.warning("cupy is not installed (pip install 'ignis[cuda]'): the KV pool cannot be shared with tierd")
            return None
        numel = math.prod(shape)
        nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
        index = device.index if device.index is not None else torch.cuda.current_device()
        rt = cupy.cuda.runtime
        try:
            with cupy.cuda.Device(index):
                ptr = rt.malloc(nbytes)
                try:
                    handle = bytes(rt.ipcGetMemHandle(ptr))
                    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None, index)
                    raw = cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
                    flat = torch.from_dlpack(raw)
                except Exception:
                    rt.free(ptr)
                    raise
        except Exception as exc:  # cupy raises its own CUDARuntimeError
            log.warning("cannot allocate an exportable KV pool of %d bytes on cuda:%d (%s): "
                        "the pool is not shared with tierd", nbytes, index, exc)
            return None
        tensor = flat.view(dtype)[:numel].view(shape)
        return cls(tensor, ptr, handle, index, rt)

    def release(self) -> None:
        """Drop the tensor and free the allocation (every user of the pool is gone)."""
        self.tensor = None
        if self._ptr:
            torch.cuda.synchronize(self.device)
            self._runtime.free(self._ptr)
            self._ptr = 0
