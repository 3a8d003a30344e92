"""The machinery under KV-disk files: aligned staging buffers, the I/O threads, O_DIRECT with its fallback,
and whole positional reads and writes (``pread_all``, ``pwrite_all``).

A ``DiskIO`` owns ``threads + 1`` staging buffers of one chunk and one
page each (page aligned, touched at creation) and a pool of ``threads`` threads. A file is
moved one chunk per job, several jobs in flight::

    write: caller fills buffer i (in payload order) -> pool: MAC chunk i, pwrite it   (chunks overlap)
    read:  pool: pread chunk i, MAC it               -> caller hands chunk i on, in order

``os.pwrite``/``os.preadv`` and numpy copies release the GIL, so the jobs
run truly in parallel; the MAC (Poly1305) holds it, but is fed 1 MiB at a
time and hashes several GB/s. With ``direct`` the file is opened with
``O_DIRECT``: the page cache is bypassed, so a file of gigabytes neither
doubles its RAM cost nor waits behind writeback. O_DIRECT needs offsets,
lengths and buffer addresses aligned to ``ALIGN``: a file moves in aligned
windows (``ignis.tierd.disk`` draws them: each carries the unaligned tail of
the one before), and only the last, partial page and the digests go through
a small aligned tail buffer.
Filesystems that refuse O_DIRECT (tmpfs, some FUSE mounts) are detected by
``direct_io_works`` at start; a file whose ``O_DIRECT`` open is refused
later is opened buffered instead (``open_file``), and ``direct`` goes off.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable
from pathlib import Path

import numpy as np

log = logging.getLogger("ignis.tierd")

ALIGN = 4096
"""Alignment of O_DIRECT offsets, lengths and buffers (the largest logical block size in use)."""

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def round_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 array of ``nbytes`` (its own anonymous mapping), every page touched."""
    mm = mmap.mmap(-1, max(ALIGN, round_up(nbytes)), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = np.frombuffer(mm, dtype=np.uint8)
    buf[::mmap.PAGESIZE] = 0
    return buf[:nbytes]


def direct_io_works(directory: str | os.PathLike) -> bool:
    """Whether files in ``directory`` take an aligned ``O_DIRECT`` write and read (False on any refusal)."""
    if not _O_DIRECT:
        return False
    probe = Path(directory) / ".ignis-direct-probe.kv.part"
    buf = aligned_buffer(ALIGN)
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o600)
        try:
            return os.pwrite(fd, buf, 0) == ALIGN and os.preadv(fd, [buf], 0) == ALIGN
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


class Stream:
    """``fill(index, dst)`` over an iterable of pieces (any sizes) taken in payload order."""

    def __init__(self, pieces: Iterable, nbytes: int):
        self._it = iter(pieces)
        self._rest = memoryview(b"")
        self.size = 0
        self.nbytes = nbytes

    def __call__(self, _index: int, dst: np.ndarray) -> None:
        at = 0
        while at < dst.nbytes:
            if not self._rest.nbytes:
                piece = next(self._it, None)
                if piece is None:
                    raise ValueError(f"wrote {self.size} payload bytes for an entry of {self.nbytes}")
                self._rest = memoryview(piece).cast("B")
                continue
            take = min(self._rest.nbytes, dst.nbytes - at)
            dst[at:at + take] = np.frombuffer(self._rest[:take], dtype=np.uint8)
            self._rest, at, self.size = self._rest[take:], at + take, self.size + take

    def end(self) -> None:
        extra = self._rest.nbytes + sum(memoryview(p).nbytes for p in self._it)
        if extra:
            raise ValueError(f"wrote {self.size + extra} payload bytes for an entry of {self.nbytes}")


def pwrite_all(fd: int, buf: np.ndarray, offset: int) -> None:
    """All of ``buf`` to ``fd`` at ``offset``."""
    view = memoryview(buf)
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def pread_all(fd: int, buf: np.ndarray, offset: int) -> int:
    """Bytes read into ``buf`` from ``offset``: all of it, or fewer at the end of the file."""
    view, got = memoryview(buf), 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


class DiskIO:
    """Staging buffers, I/O threads and the O_DIRECT choice for one KV-disk (used by one caller at a time)."""

    def __init__(self, chunk: int, threads: int = 2, direct: bool = False):
        if chunk <= 0 or chunk % ALIGN:
            raise ValueError(f"a KV-disk chunk is a positive multiple of {ALIGN} bytes, got {chunk}")
        if threads < 1:
            raise ValueError(f"DiskIO needs at least one thread, got {threads}")
        self.chunk = chunk
        self.threads = threads
        self.direct = bool(direct and _O_DIRECT)
        self.buffers: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        for _ in range(threads + 1):
            self.buffers.put(aligned_buffer(chunk + ALIGN))  # a window: up to ALIGN - 1 bytes, then a chunk
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="tierd-disk-io")

    def open_file(self, path: Path, flags: int) -> tuple[int, bool]:
        """``os.open`` with O_DIRECT when on; a refusal (EINVAL) opens buffered and turns ``direct`` off.
        Returns (fd, direct)."""
        if self.direct:
            try:
                return os.open(path, flags | _O_DIRECT, 0o600), True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                log.warning("KV-disk: %s refuses O_DIRECT; files are written and read through the page cache",
                            path.parent)
                self.direct = False
        return os.open(path, flags, 0o600), False

    def close(self) -> None:
        self.pool.shutdown(wait=True)
