"""Exporter side of engine memory: named POSIX shared-memory blocks, their descriptors, and page reservation.

``ShmBlock`` is a block laid out for tierd, with numpy views and the
descriptor a ``Hello`` carries; the stand-in engine of the tier tests and the
tier benchmark export their memory with it (the engine's own blocks are torch
tensors, ``engine.host_memory``). tierd maps the same name
(``tierd.memory_map``); nothing is copied to share it. ``reserve_pages``
allocates a new object's pages before anything touches them, for both: the
tmpfs behind shared memory (``/dev/shm``) is often small in containers, and
touching a page past its size kills the process with SIGBUS, where a
reservation fails with a clear error (``ShmFull``).

A block is described as ``runs`` x ``items`` x ``item_bytes`` (see
``shared.tier_layout.BlockDesc``); the default stride packs the runs back to
back, which is exactly the row-major layout of a tensor shaped
``[runs, items, item_bytes]``: e.g. a KV pool [L, 2, P, 64, H, D] is
``ShmBlock.create(name, runs=2 * L, items=P, item_bytes=64 * H * D * dsize)``.

Every page of a new block is written once at creation (first-touch faults
belong at load, not in a copy). The creator owns the name: ``unlink`` it when
the engine stops (Python's resource tracker also unlinks it if the creator
dies). numpy and the standard library only.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
from multiprocessing import shared_memory

import numpy as np

from ignis.shared.runtime import check_instance_name
from ignis.shared.tier_layout import BlockDesc

_PAGE = mmap.PAGESIZE
_CREATED: set[str] = set()  # shm names created by this process and not yet unlinked
SHM_DIR = "/dev/shm"
"""Where Linux keeps POSIX shared memory objects (a tmpfs)."""


class ShmFull(OSError):
    """Shared memory has no room for a new object's pages; the message names the fix."""


def reserve_pages(shm_name: str, nbytes: int) -> None:
    """Allocate the pages of the new object ``shm_name`` up front (posix_fallocate); ShmFull when they do not fit.

    Where the object is not a file under ``SHM_DIR`` or the filesystem cannot
    preallocate, nothing is reserved and the first touch allocates."""
    try:
        fd = os.open(os.path.join(SHM_DIR, shm_name.lstrip("/")), os.O_RDWR)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise ShmFull(e.errno, f"shared memory is too small: {nbytes} bytes needed, {SHM_DIR} has "
                                   f"{_free_text()} free (give it more room: docker run --shm-size, or the "
                                   f"size= option of its tmpfs mount)") from None
    finally:
        os.close(fd)


def _free_text() -> str:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return "an unknown number of bytes"
    return f"{st.f_bavail * st.f_frsize} bytes"


ENGINE_BLOCK = re.compile(r"^ignis-(\d+)-\d+-[\w.-]+$")
"""The name of an engine's host block (``engine.host_memory``): ``ignis-<creator pid>-<serial>-<random>-<tag>``."""


def unlink_orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the engine host blocks of this user whose creator process is gone (killed before it could
    unlink them): a restarted engine calls this at start. A block another process still maps stays
    mapped there; only its name goes. Returns the names unlinked."""
    gone = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return gone
    for name in names:
        m = ENGINE_BLOCK.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except OSError:
            continue
        gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def created_here(shm_name: str) -> bool:
    """Whether this process created ``shm_name`` (an attacher in the same process must leave its
    resource-tracker entry alone: the tracker keeps one entry per name and process)."""
    return shm_name.lstrip("/") in _CREATED


def block_name(instance: str, block: str) -> str:
    """A fresh shm name for ``block`` of ``instance``: ``ignis-<instance>-<block>-<pid>-<random>``."""
    check_instance_name(instance)
    return f"ignis-{instance}-{block}-{os.getpid()}-{secrets.token_hex(4)}"


class ShmBlock:
    """One named shared-memory block laid out as [runs, items, item_bytes] (run stride given)."""

    def __init__(self, shm: shared_memory.SharedMemory, block: str, runs: int, items: int, item_bytes: int,
                 run_stride_bytes: int):
        self.shm = shm
        self.block = block
        self.runs = runs
        self.items = items
        self.item_bytes = item_bytes
        self.run_stride_bytes = run_stride_bytes
        self._closed = False

    @classmethod
    def create(cls, block: str, runs: int, items: int, item_bytes: int, *, run_stride_bytes: int | None = None,
               instance: str = "default", shm_name: str | None = None, fill: int = 0) -> ShmBlock:
        """Create (and touch) a block; the descriptor is checked before any memory is allocated."""
        stride = items * item_bytes if run_stride_bytes is None else run_stride_bytes
        name = shm_name or block_name(instance, block)
        desc = BlockDesc(name=block, kind="shm", handle=name, runs=runs, items=items, item_bytes=item_bytes,
                         run_stride_bytes=stride)  # raises ValueError on a bad layout
        if not 0 <= fill <= 255:
            raise ValueError(f"fill must be a byte value 0..255, got {fill}")
        shm = shared_memory.SharedMemory(name=name, create=True, size=desc.span_bytes)
        _CREATED.add(shm.name.lstrip("/"))
        out = cls(shm, block, runs, items, item_bytes, stride)
        try:
            reserve_pages(shm.name, shm.size)
        except ShmFull:
            out.close()
            raise
        raw = np.ndarray((shm.size,), dtype=np.uint8, buffer=shm.buf)
        raw[::_PAGE] = 0  # first touch of every page, here and not in the request path
        if fill:
            raw[:] = fill
        del raw
        return out

    @property
    def name(self) -> str:
        """The POSIX shm name (what ``SharedMemory(name)`` opens)."""
        return self.shm.name

    @property
    def nbytes(self) -> int:
        return (self.runs - 1) * self.run_stride_bytes + self.items * self.item_bytes

    @property
    def buf(self) -> memoryview:
        """The block's bytes (exactly ``nbytes``; the mapping itself may be rounded up to a page)."""
        return self.shm.buf[:self.nbytes]

    def array(self) -> np.ndarray:
        """A zero-copy uint8 view shaped [runs, items, item_bytes] (strided by ``run_stride_bytes``)."""
        return np.ndarray((self.runs, self.items, self.item_bytes), dtype=np.uint8, buffer=self.shm.buf,
                          strides=(self.run_stride_bytes, self.item_bytes, 1))

    def typed(self, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The whole block as a C-contiguous array of ``dtype`` and ``shape`` (it must fill it exactly)."""
        dtype = np.dtype(dtype)
        if int(np.prod(shape)) * dtype.itemsize != self.nbytes:
            raise ValueError(f"shape {shape} of {dtype} is {int(np.prod(shape)) * dtype.itemsize} bytes; "
                             f"block {self.block!r} holds {self.nbytes}")
        return np.ndarray(shape, dtype=dtype, buffer=self.shm.buf)

    def item(self, i: int) -> np.ndarray:
        """Item ``i`` as a [runs, item_bytes] view."""
        if not 0 <= i < self.items:
            raise IndexError(f"block {self.block!r} has items 0..{self.items - 1}, not {i}")
        return self.array()[:, i, :]

    def descriptor(self) -> BlockDesc:
        return BlockDesc(name=self.block, kind="shm", handle=self.name, runs=self.runs, items=self.items,
                         item_bytes=self.item_bytes, run_stride_bytes=self.run_stride_bytes)

    def close(self) -> None:
        """Unmap and unlink the name. Views from ``array`` and ``typed`` must be gone first."""
        if self._closed:
            return
        self._closed = True
        self.shm.close()
        _CREATED.discard(self.name.lstrip("/"))
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> ShmBlock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
