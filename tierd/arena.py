"""The KV-RAM arena: one anonymous mapping, touched and locked at start, carved into fixed blocks.

::

    arena (--reuse-kv-host-pool-bytes, one mmap, page-locked whole when allowed)
    | block 0 | block 1 | ... | block n-1 | tail (< block_bytes, unused) |
      <- block_bytes (set at hello: the engine's page bytes) ->

An entry holds a list of blocks, not necessarily contiguous; its payload
byte p lives in ``blocks[p // block_bytes]`` at ``p % block_bytes``. The
memory is mapped, written once per page and locked at start, and held while
an engine may use it; only the block size is set (and reset) at hello. When
the engine detaches (its ``Bye``: an idle unload, a model switch, a stop)
tierd gives the memory back (``release``: unpinned, unlocked, unmapped) and
maps, touches and locks it again at the next hello (``acquire``), so an
idle instance holds no locked memory.

Locking: ``lock="require"`` locks the whole arena or raises ``MlockError``
naming the fix; ``lock="try"`` locks as much as the limit allows, in chunks,
and reports the rest as ``unlocked_bytes``. On CUDA the arena is also
registered as pinned memory (``pin_for_cuda``, cupy imported only then).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import heapq
import mmap
import os
import resource

import numpy as np

PAGE = mmap.PAGESIZE
_CHUNK = 64 << 20
_MADV_DONTNEED = 4


class MlockError(OSError):
    """The arena could not be locked and locking is required; the message names the fix."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def memlock_limit() -> int | None:
    """RLIMIT_MEMLOCK's soft limit in bytes (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def lock_fix_message(nbytes: int, err: str) -> str:
    limit = memlock_limit()
    limit_text = "unlimited" if limit is None else f"{limit} bytes"
    return (f"cannot lock the {nbytes}-byte KV-RAM arena in memory (mlock: {err}; RLIMIT_MEMLOCK is {limit_text}). "
            f"Under systemd set LimitMEMLOCK=infinity in the unit; by hand raise the limit with "
            f"`ulimit -l unlimited` (or a value above {nbytes // 1024} KiB), shrink --reuse-kv-host-pool-bytes, "
            f"or pass --require-mlock off to run with part of the arena unlocked")


class Arena:
    """The mapping itself: ``view`` is a flat uint8 array over all of it."""

    def __init__(self, nbytes: int, lock: str = "try"):
        if type(nbytes) is not int or nbytes < 0:
            raise ValueError(f"--reuse-kv-host-pool-bytes must be a byte count >= 0, got {nbytes!r}")
        if lock not in ("require", "try"):
            raise ValueError(f"lock must be 'require' or 'try', got {lock!r}")
        self.nbytes = nbytes
        self.lock_mode = lock
        self.locked_bytes = 0
        self.lock_error = ""
        self._pinned = False
        self._mm = None
        self.view = np.zeros(0, dtype=np.uint8)
        self.address = 0
        self.acquire()

    @property
    def mapped(self) -> bool:
        """The memory is mapped (always, for a zero-byte arena: there is nothing to map)."""
        return self._mm is not None or self.nbytes == 0

    @property
    def mapped_bytes(self) -> int:
        return self.nbytes if self._mm is not None else 0

    @property
    def unlocked_bytes(self) -> int:
        """Mapped bytes that are not locked (a released arena has none)."""
        return self.mapped_bytes - self.locked_bytes

    def acquire(self) -> None:
        """Map, touch and lock the memory (at start, and at a hello after ``release``); a no-op while mapped.
        ``MlockError`` (lock="require") leaves it released."""
        if self.mapped:
            return
        self.lock_error = ""
        self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = np.frombuffer(self._mm, dtype=np.uint8)
        self.address = int(self.view.ctypes.data)
        self.view[::PAGE] = 0  # first touch of every page now, not in a copy
        self._lock(self.lock_mode)

    def release(self) -> None:
        """Give the memory back (unpin, unlock, unmap) while no engine uses it; ``acquire`` takes it again."""
        self.close()

    def _lock(self, mode: str) -> None:
        libc = _libc()
        libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        if libc.mlock(ctypes.c_void_p(self.address), ctypes.c_size_t(self.nbytes)) == 0:
            self.locked_bytes = self.nbytes
            return
        err = os.strerror(ctypes.get_errno())
        self.lock_error = err
        if mode == "require":
            self.close()
            raise MlockError(lock_fix_message(self.nbytes, err))
        # Lock what the limit allows: chunks from the start, halving the chunk on each failure.
        chunk = min(_CHUNK, self.nbytes)
        while self.locked_bytes < self.nbytes and chunk >= PAGE:
            n = min(chunk, self.nbytes - self.locked_bytes)
            if libc.mlock(ctypes.c_void_p(self.address + self.locked_bytes), ctypes.c_size_t(n)) == 0:
                self.locked_bytes += n
            else:
                chunk = (chunk // 2) // PAGE * PAGE

    def pin_for_cuda(self) -> None:
        """Register the arena as pinned host memory for DMA (CUDA only; imports cupy)."""
        if self._pinned or self.nbytes == 0:
            return
        import cupy  # noqa: PLC0415 - CUDA path only

        portable = 1  # cudaHostRegisterPortable: pinned for every CUDA context, not just this thread's
        try:
            cupy.cuda.runtime.hostRegister(self.address, self.nbytes, portable)
        except Exception as e:  # cupy's CUDARuntimeError
            raise OSError(f"cannot register the {self.nbytes}-byte arena as pinned CUDA memory: {e}") from None
        self._pinned = True

    def close(self) -> None:
        if self._mm is None:
            return
        if self._pinned:
            import cupy  # noqa: PLC0415

            cupy.cuda.runtime.hostUnregister(self.address)
            self._pinned = False
        if self.locked_bytes:
            libc = _libc()
            libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
            libc.munlock(ctypes.c_void_p(self.address), ctypes.c_size_t(self.locked_bytes))
        self.locked_bytes = 0
        self.view = np.zeros(0, dtype=np.uint8)
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere: the mapping stays, its pages go back
            libc = _libc()
            libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            libc.madvise(ctypes.c_void_p(self.address), ctypes.c_size_t(self.nbytes), _MADV_DONTNEED)
        self._mm = None
        self.address = 0


class BlockAllocator:
    """Free list of block indices 0..n-1; the lowest free indices are handed out first.

    Invariant (``check``): every index is exactly one of free or allocated.
    """

    def __init__(self, n: int):
        if type(n) is not int or n < 0:
            raise ValueError(f"block count must be an integer >= 0, got {n!r}")
        self.n = n
        self._free = list(range(n))  # a heap
        self._used: set[int] = set()

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return len(self._used)

    def allocate(self, k: int) -> list[int]:
        """``k`` free blocks, lowest first; raises ``MemoryError`` (allocating none) when fewer are free."""
        if type(k) is not int or k < 0:
            raise ValueError(f"block count must be an integer >= 0, got {k!r}")
        if k > len(self._free):
            raise MemoryError(f"{k} arena blocks asked for, {len(self._free)} free")
        out = [heapq.heappop(self._free) for _ in range(k)]
        self._used.update(out)
        return out

    def free(self, blocks: list[int]) -> None:
        """Give ``blocks`` back; a block not allocated (or given twice) raises before any is freed."""
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"block list repeats an index: {blocks}")
        bad = [b for b in blocks if b not in self._used]
        if bad:
            raise ValueError(f"blocks {bad} are not allocated")
        for b in blocks:
            self._used.remove(b)
            heapq.heappush(self._free, b)

    def check(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise RuntimeError("arena free list holds an index twice")
        if free & self._used:
            raise RuntimeError(f"arena blocks both free and allocated: {sorted(free & self._used)}")
        if free | self._used != set(range(self.n)):
            raise RuntimeError("arena blocks lost: neither free nor allocated")
