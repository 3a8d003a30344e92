"""Mapping the blocks the engine exported at hello, and resolving (block, item) refs against them.

A mapped block is seen as [runs, items, item_bytes] (``shared.tier_layout.BlockDesc``):

- kind "shm": ``SharedMemory(name, create=False)`` and a zero-copy numpy view
  with strides (run_stride_bytes, item_bytes, 1), its pages mapped at once
  (``populate``: a copy into a fresh mapping would fault every 4 KiB and run
  at a tenth of memcpy speed). tierd never unlinks the
  name (the engine owns it) and keeps it out of Python's resource tracker,
  which would otherwise unlink it when tierd exits.
- kind "cuda_ipc": ``cudaIpcOpenMemHandle`` via cupy on the block's device,
  imported only here and only then; the copier addresses it by device
  pointer. The handle is of an allocation of its own, so the pointer it opens
  at is the block's first byte.

``EngineMemory.resolve`` checks a ref list before any byte moves: known
blocks, items in range, no item named twice, and the order the hello's
``UnitLayout`` allows (pages, then one item of each lane block or one image).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from ignis.shared.shm_blocks import created_here
from ignis.shared.tier_layout import BlockDesc, UnitLayout


class LayoutError(ValueError):
    """The exported blocks or a ref list do not fit what was described; the message says which."""


class MappedBlock:
    """One engine block mapped into tierd."""

    kind = ""

    def __init__(self, desc: BlockDesc):
        self.desc = desc
        self.name = desc.name
        self.runs = desc.runs
        self.items = desc.items
        self.item_bytes = desc.item_bytes
        self.run_stride = desc.run_stride_bytes
        self.item_total = desc.item_total

    def close(self) -> None:
        raise NotImplementedError


class ShmBlockMap(MappedBlock):
    kind = "shm"

    def __init__(self, desc: BlockDesc):
        super().__init__(desc)
        try:
            self._shm = _attach(desc.handle)
        except FileNotFoundError:
            raise LayoutError(f"block {desc.name!r}: no shared memory named {desc.handle!r}") from None
        except OSError as e:
            raise LayoutError(f"block {desc.name!r}: cannot open shared memory {desc.handle!r}: {e}") from None
        if self._shm.size < desc.span_bytes:
            size = self._shm.size
            self._shm.close()
            raise LayoutError(f"block {desc.name!r}: shared memory {desc.handle!r} is {size} bytes, the descriptor "
                              f"needs {desc.span_bytes} ((runs-1) * run_stride + items * item_bytes)")
        self.view = np.ndarray((desc.runs, desc.items, desc.item_bytes), dtype=np.uint8, buffer=self._shm.buf,
                               strides=(desc.run_stride_bytes, desc.item_bytes, 1))
        populate(self._shm.buf, desc.span_bytes)


    def close(self) -> None:
        self.view = None
        try:
            self._shm.close()
        except BufferError:
            pass  # a copy still holds a view; the mapping goes when it does


_MADV_POPULATE_WRITE = 23  # Linux 5.14+


def populate(buf, nbytes: int) -> None:
    """Map every page of ``buf[:nbytes]`` into this process now (writable), so no copy later pays a page
    fault per 4 KiB: ``madvise(MADV_POPULATE_WRITE)``, or a read of one byte per page where the kernel
    lacks it. The pages already exist (the engine reserved and wrote them), so this takes no memory."""
    if nbytes <= 0:
        return
    view = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    start = view.ctypes.data - view.ctypes.data % mmap.PAGESIZE
    if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(view.ctypes.data + nbytes - start),
                    _MADV_POPULATE_WRITE) != 0:
        int(view[::mmap.PAGESIZE].max())


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing segment without making this process's resource tracker unlink it at exit."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=False, track=False)
    shm = shared_memory.SharedMemory(name=name, create=False)  # registers the name with the tracker
    if not created_here(name):  # the engine owns the name; in-process tests keep the creator's entry
        resource_tracker.unregister(shm._name, "shared_memory")
    return shm


class CudaIpcBlockMap(MappedBlock):
    """A device block opened from a CUDA IPC handle (cupy; CUDA machines only)."""

    kind = "cuda_ipc"

    def __init__(self, desc: BlockDesc):
        super().__init__(desc)
        try:
            import cupy  # noqa: PLC0415 - CUDA path only
        except ImportError:
            raise LayoutError(f"block {desc.name!r} is a CUDA IPC handle; tierd needs cupy for it "
                              f"(pip install 'ignis[cuda]')") from None
        self._cupy = cupy
        self.device = desc.device
        try:
            with cupy.cuda.Device(desc.device):
                self.device_ptr = int(cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(desc.handle)))
        except Exception as e:  # cupy's CUDARuntimeError: a stale handle, another machine's, a bad device
            raise LayoutError(f"block {desc.name!r}: cannot open its CUDA IPC handle on device {desc.device}: "
                              f"{e}") from None

    def close(self) -> None:
        if self.device_ptr:
            with self._cupy.cuda.Device(self.device):
                self._cupy.cuda.runtime.ipcCloseMemHandle(self.device_ptr)
            self.device_ptr = 0


def map_block(desc: BlockDesc) -> MappedBlock:
    return ShmBlockMap(desc) if desc.kind == "shm" else CudaIpcBlockMap(desc)


@dataclass(frozen=True)
class Resolved:
    """A checked ref list: the mapped block and item of each ref, and the payload size."""

    items: tuple[tuple[MappedBlock, int], ...]
    shape: tuple[str, ...]
    nbytes: int


class EngineMemory:
    """Every block of one hello, mapped; closes them all if any fails to map."""

    def __init__(self, blocks: tuple[BlockDesc, ...], unit: UnitLayout):
        self.unit = unit
        self.blocks: dict[str, MappedBlock] = {}
        try:
            for desc in blocks:
                self.blocks[desc.name] = map_block(desc)
        except BaseException:
            self.close()
            raise
        if len({b.device for b in self.blocks.values() if b.kind == "cuda_ipc"}) > 1:
            self.close()
            raise LayoutError("the exported CUDA blocks must all be on one device (the copier uses one)")
        lane = [self.blocks[n] for n in unit.lane]
        if lane and len({b.items for b in lane}) != 1:
            self.close()
            raise LayoutError(f"lane blocks {list(unit.lane)} must have the same number of items (lanes)")

    @property
    def uses_cuda(self) -> bool:
        return self.cuda_device is not None

    @property
    def cuda_device(self) -> int | None:
        """The CUDA device the exported device blocks live on (None: all blocks are host memory)."""
        devices = {b.device for b in self.blocks.values() if b.kind == "cuda_ipc"}
        return devices.pop() if devices else None

    def resolve(self, refs: tuple[tuple[str, int], ...], what: str = "refs") -> Resolved:
        """Check ``refs`` against the blocks and the unit layout (see the module docstring)."""
        items = []
        for i, (name, item) in enumerate(refs):
            block = self.blocks.get(name)
            if block is None:
                raise LayoutError(f"{what}[{i}] names block {name!r}; the engine exported {sorted(self.blocks)}")
            if item >= block.items:
                raise LayoutError(f"{what}[{i}]: block {name!r} has items 0..{block.items - 1}, not {item}")
            items.append((block, item))
        if len(set(refs)) != len(refs):
            raise LayoutError(f"{what} names the same item twice")
        shape = tuple(name for name, _ in refs)
        self._check_order(shape, what)
        return Resolved(tuple(items), shape, sum(b.item_total for b, _ in items))

    def _check_order(self, shape: tuple[str, ...], what: str) -> None:
        u = self.unit
        at = 0
        while at < len(shape) and shape[at] == u.pages:
            at += 1
        rest = shape[at:]
        tails = [(), u.lane, (u.image,) if u.image else ()]
        if rest not in tails:
            allowed = f"{u.pages!r} items" if u.pages else "no pages"
            raise LayoutError(f"{what} must be {allowed}, then one item of each of {list(u.lane)} or one "
                              f"{u.image!r} item, or nothing; got blocks {list(shape)}")

    def close(self) -> None:
        for block in self.blocks.values():
            block.close()
        self.blocks = {}
