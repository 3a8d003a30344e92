"""Every copy between engine memory and tierd's host buffers, and the worker threads that run them.

An entry's payload is its items concatenated in ref order, each item its
runs back to back. In a host buffer (the arena, or one staging buffer) the
payload is spread over blocks of ``block_bytes``. ``plan_spans`` cuts the
copy into spans, each a rectangle of one item's [runs, item_bytes] matrix
that is contiguous on the host side::

    engine item i (strided)             host (contiguous inside one block)
    run r0   [c0 ........ c1)   <->     | row r0 | row r0+1 | ... |
    ...                                  <- (c1 - c0) bytes per row ->
    run r1-1 [c0 ........ c1)

``coalesce`` then merges spans that continue each other on both sides
(the next item with the same rectangle, or the same item's next rows), so
pages that are neighbours in engine memory and in the arena move as one
copy: one numpy assignment per span on the CPU, over [rows, items, cols]
(``ParallelBackend`` cuts a large copy into a few parts run at once), and
one cudaMemcpy2DAsync per item (source pitch = run stride) on CUDA.
Engine memory <-> KV-disk goes a chunk at a time through ``DiskIO``'s
staging windows (``write_from_engine``, ``read_into_engine``). ``Worker``
runs jobs on its own thread and hands results back through a callback; the
server's loop never waits on a copy or a file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

import numpy as np

from ignis.tierd import disk as kvdisk
from ignis.tierd import disk_io
from ignis.tierd.memory_map import MappedBlock
from ignis.shared.fault_env import env_seconds

log = logging.getLogger("ignis.tierd")


@dataclass(frozen=True)
class Span:
    """Rows [run_lo, run_hi) x bytes [col_lo, col_hi) of ``block``'s items [item, item + n_items) <-> host bytes
    at ``host``, item after item (each item's rectangle row by row)."""

    block: MappedBlock
    item: int
    run_lo: int
    run_hi: int
    col_lo: int
    col_hi: int
    host: int
    n_items: int = 1

    @property
    def item_nbytes(self) -> int:
        return (self.run_hi - self.run_lo) * (self.col_hi - self.col_lo)

    @property
    def nbytes(self) -> int:
        return self.n_items * self.item_nbytes


def plan_spans(items: Sequence[tuple[MappedBlock, int]], host_blocks: Sequence[int], block_bytes: int,
               start: int = 0) -> list[Span]:
    """Spans copying ``items`` (payload order, from payload byte ``start``: the bytes of the items a
    restore skips come first) to or from ``host_blocks`` of ``block_bytes`` each."""
    total = start + sum(b.item_total for b, _ in items)
    if len(host_blocks) * block_bytes < total:
        raise ValueError(f"{len(host_blocks)} host blocks of {block_bytes} bytes cannot hold {total} bytes")
    spans: list[Span] = []
    p = start  # payload offset of the current item
    for block, item in items:
        width = block.item_bytes
        a = 0
        while a < block.item_total:  # item-local byte a .. b, inside one host block
            q = p + a
            b = min(block.item_total, a + block_bytes - q % block_bytes)
            host = host_blocks[q // block_bytes] * block_bytes + q % block_bytes
            spans.extend(_rows(block, item, a, b, width, host))
            a = b
        p += block.item_total
    return spans


def _rows(block: MappedBlock, item: int, a: int, b: int, width: int, host: int) -> list[Span]:
    """Item bytes [a, b) (row-major over [runs, width]) as at most three rectangles."""
    r0, c0 = divmod(a, width)
    r1, c1 = divmod(b, width)
    if r0 == r1:
        return [Span(block, item, r0, r0 + 1, c0, c1, host)]
    out = []
    if c0:
        out.append(Span(block, item, r0, r0 + 1, c0, width, host))
        host += width - c0
        r0 += 1
    if r1 > r0:
        out.append(Span(block, item, r0, r1, 0, width, host))
        host += (r1 - r0) * width
    if c1:
        out.append(Span(block, item, r1, r1 + 1, 0, c1, host))
    return out


def coalesce(spans: Sequence[Span]) -> list[Span]:
    """``spans`` with neighbours merged into one copy where both sides continue each other.

    A span joins the one before it when it is the next item with the same
    rectangle right after it on the host (one strided copy of several
    items), or the same item's next rows, full width, right after it on the
    host (one block of rows)."""
    out: list[Span] = []
    for t in spans:
        s = out[-1] if out else None
        if s is not None and t.block is s.block and t.host == s.host + s.nbytes:
            if (t.n_items == 1 and t.item == s.item + s.n_items and (t.run_lo, t.run_hi, t.col_lo, t.col_hi)
                    == (s.run_lo, s.run_hi, s.col_lo, s.col_hi)):
                out[-1] = replace(s, n_items=s.n_items + 1)
                continue
            full = (0, s.block.item_bytes)
            if (s.n_items == t.n_items == 1 and t.item == s.item and t.run_lo == s.run_hi
                    and (s.col_lo, s.col_hi) == (t.col_lo, t.col_hi) == full):
                out[-1] = replace(s, run_hi=t.run_hi)
                continue
        out.append(t)
    return out


def split(spans: Sequence[Span], parts: int) -> list[list[Span]]:
    """``spans`` cut into at most ``parts`` lists of about equal bytes (a span is cut between items or rows)."""
    total = sum(s.nbytes for s in spans)
    share = -(-total // max(1, parts))
    out: list[list[Span]] = [[]]
    room = share
    for s in spans:
        while s is not None:
            if room <= 0:
                out.append([])
                room = share
            head, s = _cut(s, room)
            out[-1].append(head)
            room -= head.nbytes
    return [p for p in out if p]


def _cut(s: Span, nbytes: int) -> tuple[Span, Span | None]:
    """(the first whole items or rows of ``s`` within about ``nbytes``, the rest or None)."""
    if s.nbytes <= nbytes:
        return s, None
    if s.n_items > 1:
        k = max(1, nbytes // s.item_nbytes)
        return (replace(s, n_items=k),
                replace(s, item=s.item + k, n_items=s.n_items - k, host=s.host + k * s.item_nbytes))
    width, rows = s.col_hi - s.col_lo, s.run_hi - s.run_lo
    r = max(1, nbytes // width)
    if rows <= 1 or r >= rows:
        return s, None
    return replace(s, run_hi=s.run_lo + r), replace(s, run_lo=s.run_lo + r, host=s.host + r * width)


def _views(s: Span, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(engine view, host view) of ``s``, both [rows, items, cols]."""
    rows, cols = s.run_hi - s.run_lo, s.col_hi - s.col_lo
    h = host[s.host:s.host + s.nbytes].reshape(s.n_items, rows, cols).transpose(1, 0, 2)
    return s.block.view[s.run_lo:s.run_hi, s.item:s.item + s.n_items, s.col_lo:s.col_hi], h


class NumpyBackend:
    """CPU copies: one numpy assignment per span between shm views and a host uint8 array."""

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        """Engine -> host."""
        for s in spans:
            eng, h = _views(s, host)
            h[...] = eng

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        """Host -> engine."""
        for s in spans:
            eng, h = _views(s, host)
            eng[...] = h

    def close(self) -> None:
        pass


PARALLEL_MIN_BYTES = 4 << 20
"""A copy smaller than this runs on the calling thread: handing it to others costs more than it saves."""


class ParallelBackend:
    """Cuts each copy into ``threads`` parts of about equal bytes and runs them at once (numpy releases
    the GIL), so one large copy uses several cores' memory bandwidth."""

    def __init__(self, inner, threads: int):
        self.inner = inner
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="tierd-copy") if threads > 1 else None

    def _run(self, fn, spans: Sequence[Span], host: np.ndarray) -> None:
        if self._pool is None or sum(s.nbytes for s in spans) < PARALLEL_MIN_BYTES:
            return fn(spans, host)
        first, *rest = split(spans, self.threads)
        jobs = [self._pool.submit(fn, part, host) for part in rest]
        try:
            fn(first, host)  # the calling thread copies a part too
        finally:
            wait(jobs)  # every part finishes before the copy is reported, failed or not
        for job in jobs:
            job.result()

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._run(self.inner.gather, spans, host)

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._run(self.inner.scatter, spans, host)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


_DEFAULT_MAX_PITCH = 2**31 - 1
"""cudaDevAttrMaxPitch on every current NVIDIA GPU; used when the device cannot be asked."""

_ATTR_MAX_PITCH = 11  # cudaDevAttrMaxPitch


def _device_max_pitch(runtime, device: int) -> int:
    try:
        return int(runtime.deviceGetAttribute(_ATTR_MAX_PITCH, device))
    except Exception:  # noqa: BLE001 - cupy's CUDARuntimeError, or an old cupy without the call
        return _DEFAULT_MAX_PITCH


class CupyBackend:
    """CUDA copies on tierd's own stream: cudaMemcpy2DAsync between device blocks and pinned host memory.

    Spans over host blocks (the engine's pinned shm slots) are plain numpy
    copies; only spans over ``cuda_ipc`` blocks go to the device, as the
    fewest 2D rectangles their shape allows (``_device_rects``). A rectangle
    whose pitch is wider than the device's largest 2D pitch (one item's runs
    at the stride of a pool of more than 16K pages) goes as one 1D copy per row.
    ``runtime`` and ``stream`` are cupy's unless given (tests pass a
    host-memory stand-in to check the pitch arithmetic on the CPU)."""

    def __init__(self, device: int = 0, runtime=None, stream=None, max_pitch: int | None = None):
        self._numpy = NumpyBackend()
        self.device = device
        if runtime is None:
            import cupy  # noqa: PLC0415 - CUDA path only

            runtime = cupy.cuda.runtime
            with cupy.cuda.Device(device):
                stream = cupy.cuda.Stream(non_blocking=True)
            self._use_device = lambda: cupy.cuda.Device(device)
            if max_pitch is None:
                max_pitch = _device_max_pitch(runtime, device)
        else:
            self._use_device = contextlib.nullcontext
        self._rt = runtime
        self._stream = stream
        self.max_pitch = max_pitch if max_pitch is not None else _DEFAULT_MAX_PITCH

    def _copy(self, spans: Sequence[Span], host: np.ndarray, to_host: bool) -> None:
        on_host = [s for s in spans if s.block.kind != "cuda_ipc"]
        on_device = [s for s in spans if s.block.kind == "cuda_ipc"]
        if on_host:
            (self._numpy.gather if to_host else self._numpy.scatter)(on_host, host)
        if not on_device:
            return
        base = int(host.ctypes.data)
        kind = self._rt.memcpyDeviceToHost if to_host else self._rt.memcpyHostToDevice
        stream = self._stream.ptr
        with self._use_device():  # the thread's current device: the one the blocks live on
            for s in on_device:
                for dev, dev_pitch, hst, host_pitch, width, rows in _device_rects(s, base, self.max_pitch):
                    if rows > 1 and max(dev_pitch, host_pitch) <= self.max_pitch:
                        if to_host:
                            self._rt.memcpy2DAsync(hst, host_pitch, dev, dev_pitch, width, rows, kind, stream)
                        else:
                            self._rt.memcpy2DAsync(dev, dev_pitch, hst, host_pitch, width, rows, kind, stream)
                        continue
                    for r in range(rows):  # one row, or a pitch too wide for a 2D copy
                        d, h = dev + r * dev_pitch, hst + r * host_pitch
                        if to_host:
                            self._rt.memcpyAsync(h, d, width, kind, stream)
                        else:
                            self._rt.memcpyAsync(d, h, width, kind, stream)
            self._stream.synchronize()  # the reply goes out only once the bytes are there

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._copy(spans, host, to_host=True)

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._copy(spans, host, to_host=False)

    def close(self) -> None:
        pass


def _device_rects(s: Span, host_base: int, max_pitch: int = _DEFAULT_MAX_PITCH):
    """(device address, device pitch, host address, host pitch, width, rows) rectangles of a device span,
    as few as its shape allows. Whole one-row items: one contiguous row. One item: its runs, one row each
    at the run stride. Several items: one rectangle per item (its runs at the run stride) when there are
    fewer items than runs and the run stride is a legal pitch; else one rectangle per run whose rows are
    the items (at the item size on the device, at each item's host bytes on the host): as many copies as
    an item has runs (32 on the 27B) whatever the span's length, at a page's pitch, where the run stride
    passes the largest 2D pitch (2 GB, a pool of more than 16K pages) and would cost a copy per item and
    run."""
    rows, cols = s.run_hi - s.run_lo, s.col_hi - s.col_lo
    dev = s.block.device_ptr + s.run_lo * s.block.run_stride + s.item * s.block.item_bytes + s.col_lo
    host = host_base + s.host
    if rows == 1 and (s.n_items == 1 or cols == s.block.item_bytes):
        yield dev, s.block.run_stride, host, cols, cols * s.n_items, 1
        return
    if s.n_items == 1:
        yield dev, s.block.run_stride, host, cols, cols, rows
        return
    if s.n_items < rows and s.block.run_stride <= max_pitch:
        for j in range(s.n_items):
            yield dev + j * s.block.item_bytes, s.block.run_stride, host + j * s.item_nbytes, cols, cols, rows
        return
    for r in range(rows):
        yield dev + r * s.block.run_stride, s.block.item_bytes, host + r * cols, s.item_nbytes, cols, s.n_items


FAULT_PAUSE_ENV = "IGNIS_TIERD_FAULT_PAUSE_S"
"""Fault injection for tests: every copy stops this many seconds after its first half of spans."""


class PausingBackend:
    """Wraps a backend so each copy pauses half way (``FAULT_PAUSE_ENV``): a kill then lands mid-copy."""

    def __init__(self, inner, pause_s: float):
        self.inner = inner
        self.pause_s = pause_s

    def _split(self, fn, spans: Sequence[Span], host: np.ndarray) -> None:
        half = len(spans) // 2
        fn(spans[:half], host)
        time.sleep(self.pause_s)
        fn(spans[half:], host)

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._split(self.inner.gather, spans, host)

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._split(self.inner.scatter, spans, host)

    def close(self) -> None:
        self.inner.close()


def fault_pause_s() -> float:
    return env_seconds(FAULT_PAUSE_ENV)


def copy_threads() -> int:
    """Threads for one engine <-> arena copy: a few, never more than the cores."""
    return max(1, min(4, os.cpu_count() or 1))


def make_backend(cuda_device: int | None, threads: int = 1):
    """The CUDA backend for blocks on ``cuda_device``, or numpy when no block is on a device; numpy copies
    run on ``threads`` threads (CUDA copies are DMA on tierd's stream already)."""
    if cuda_device is None:
        backend = NumpyBackend() if threads <= 1 else ParallelBackend(NumpyBackend(), threads)
    else:
        backend = CupyBackend(cuda_device)
    pause = fault_pause_s()
    return PausingBackend(backend, pause) if pause > 0 else backend


def plan_copy(items: Sequence[tuple[MappedBlock, int]], host_blocks: Sequence[int], block_bytes: int,
              start: int = 0) -> list[Span]:
    """``plan_spans``, coalesced: what the backends are given."""
    return coalesce(plan_spans(items, host_blocks, block_bytes, start))


def _by_chunk(items, nbytes: int, chunk: int, start: int = 0) -> dict[int, list[Span]]:
    """The copy of payload chunk ``i`` (host offsets from the chunk's start) for every ``i`` it touches."""
    groups: dict[int, list[Span]] = {}
    for s in plan_spans(items, range(kvdisk.chunk_count(nbytes, chunk)), chunk, start):
        i = s.host // chunk
        groups.setdefault(i, []).append(replace(s, host=s.host - i * chunk))
    return {i: coalesce(g) for i, g in groups.items()}


def write_from_engine(backend, items, path, header: bytes, nbytes: int, io: disk_io.DiskIO, mac_key: bytes) -> int:
    """Engine memory -> KV-disk file: each chunk is gathered into a staging window, then MACed and
    written by ``io``'s threads while the next is gathered (disk thread)."""
    groups = _by_chunk(items, nbytes, io.chunk)
    return kvdisk.write_entry(path, header, lambda i, dst: backend.gather(groups.get(i, []), dst), nbytes,
                              mac_key, io.chunk, io)


def read_into_engine(backend, items, path, header: bytes, nbytes: int, io: disk_io.DiskIO, mac_key: bytes,
                     start: int = 0) -> None:
    """KV-disk file -> engine memory, from payload byte ``start`` (``items`` hold what follows; the chunks
    before the one holding it are not read); each chunk is verified before it is copied on (disk thread)."""
    groups = _by_chunk(items, nbytes, io.chunk, start)

    def scatter(offset: int, view) -> None:
        spans = groups.get(offset // io.chunk)
        if spans:
            backend.scatter(spans, view)

    kvdisk.read_entry(path, header, nbytes, scatter, mac_key, io.chunk, io, start)


class NotStarted(RuntimeError):
    """The outcome of a job queued behind a stalled one when its session ended: it never ran."""


class Worker:
    """One thread running submitted jobs in order; ``post`` delivers each outcome to the server's loop.

    Once closed, the jobs still queued are not started, and the outcome of one
    still running (abandoned when its session ended) is logged and dropped:
    their ``done`` belongs to a closed store.
    """

    def __init__(self, name: str, post: Callable[[Callable[[], None]], None]):
        self.name = name
        self._post = post
        self._jobs: queue.Queue = queue.Queue()
        self.in_flight = 0  # touched by the server's loop only (submit and the posted callbacks)
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=f"tierd-{name}", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """The thread is still alive (after ``close``: a job it was running has not returned yet)."""
        return self._thread.is_alive()

    def submit(self, job: Callable[[], object], done: Callable[[object, BaseException | None, float], None]) -> None:
        """Run ``job()`` on the thread; then ``done(result, error, seconds)`` runs on the server's loop."""
        self.in_flight += 1

        def finish(result, error, seconds):
            self.in_flight -= 1
            if self.closed:
                if not isinstance(error, NotStarted):
                    log.warning("a %s job abandoned when its session ended has returned after %.1f s%s; nothing "
                                "of it is kept", self.name, seconds, f" ({type(error).__name__})" if error else "")
                return
            done(result, error, seconds)

        self._jobs.put((job, finish))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, finish = item
            t0 = time.perf_counter()
            if self.closed:  # queued behind a stalled job when its session ended: never started
                result, error = None, NotStarted("not started: its session ended")
            else:
                try:
                    result, error = job(), None
                except BaseException as e:  # reported to the loop, which decides what it means
                    result, error = None, e
            seconds = time.perf_counter() - t0
            self._post(lambda f=finish, r=result, e=error, s=seconds: f(r, e, s))

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True
        self._jobs.put(None)
        self._thread.join(timeout)
