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

so a span is one numpy assignment on the CPU and one cudaMemcpy2DAsync
(source pitch = run stride) on CUDA. Engine memory <-> KV-disk goes through
one reused staging buffer, a file chunk at a time (``write_from_engine``,
``read_into_engine``). ``Worker`` runs jobs on its own thread and hands
results back through a callback; the server's loop never waits on a copy
or a file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ignis.tierd import disk as kvdisk
from ignis.tierd.memory_map import MappedBlock

log = logging.getLogger("ignis.tierd")


@dataclass(frozen=True)
class Span:
    """Rows [run_lo, run_hi) x bytes [col_lo, col_hi) of ``block``'s item ``item`` <-> host bytes at ``host``."""

    block: MappedBlock
    item: int
    run_lo: int
    run_hi: int
    col_lo: int
    col_hi: int
    host: int

    @property
    def nbytes(self) -> int:
        return (self.run_hi - self.run_lo) * (self.col_hi - self.col_lo)


def plan_spans(items: Sequence[tuple[MappedBlock, int]], host_blocks: Sequence[int], block_bytes: int) -> list[Span]:
    """Spans copying ``items`` (payload order) to or from ``host_blocks`` of ``block_bytes`` each."""
    total = sum(b.item_total for b, _ in items)
    if len(host_blocks) * block_bytes < total:
        raise ValueError(f"{len(host_blocks)} host blocks of {block_bytes} bytes cannot hold {total} bytes")
    spans: list[Span] = []
    p = 0  # payload offset of the current item
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


class NumpyBackend:
    """CPU copies: numpy assignments between shm views and a host uint8 array."""

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        """Engine -> host."""
        for s in spans:
            rows, cols = s.run_hi - s.run_lo, s.col_hi - s.col_lo
            dst = host[s.host:s.host + rows * cols].reshape(rows, cols)
            dst[...] = s.block.view[s.run_lo:s.run_hi, s.item, s.col_lo:s.col_hi]

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        """Host -> engine."""
        for s in spans:
            rows, cols = s.run_hi - s.run_lo, s.col_hi - s.col_lo
            src = host[s.host:s.host + rows * cols].reshape(rows, cols)
            s.block.view[s.run_lo:s.run_hi, s.item, s.col_lo:s.col_hi] = src


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
    copies; only spans over ``cuda_ipc`` blocks go to the device. A span whose
    run stride is wider than the device's largest 2D pitch (a BF16 pool of
    a few million tokens has runs of several GB) goes as one 1D copy per row.
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
                rows, cols = s.run_hi - s.run_lo, s.col_hi - s.col_lo
                pitch = s.block.run_stride
                dev = s.block.device_ptr + s.run_lo * pitch + s.item * s.block.item_bytes + s.col_lo
                hst = base + s.host
                if rows > 1 and pitch <= self.max_pitch:
                    if to_host:
                        self._rt.memcpy2DAsync(hst, cols, dev, pitch, cols, rows, kind, stream)
                    else:
                        self._rt.memcpy2DAsync(dev, pitch, hst, cols, cols, rows, kind, stream)
                    continue
                for r in range(rows):  # one row, or a pitch too wide for a 2D copy
                    d, h = dev + r * pitch, hst + r * cols
                    if to_host:
                        self._rt.memcpyAsync(h, d, cols, kind, stream)
                    else:
                        self._rt.memcpyAsync(d, h, cols, kind, stream)
            self._stream.synchronize()  # the reply goes out only once the bytes are there

    def gather(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._copy(spans, host, to_host=True)

    def scatter(self, spans: Sequence[Span], host: np.ndarray) -> None:
        self._copy(spans, host, to_host=False)


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


def fault_pause_s() -> float:
    try:
        return max(0.0, float(os.environ.get(FAULT_PAUSE_ENV, "0") or 0))
    except ValueError:
        return 0.0


def make_backend(cuda_device: int | None):
    """The CUDA backend for blocks on ``cuda_device``, or numpy when no block is on a device."""
    backend = NumpyBackend() if cuda_device is None else CupyBackend(cuda_device)
    pause = fault_pause_s()
    return PausingBackend(backend, pause) if pause > 0 else backend


def _by_chunk(spans: Sequence[Span], chunk: int) -> dict[int, list[Span]]:
    """Spans grouped by the ``chunk``-sized piece of the payload they fall in, shifted to start at 0."""
    groups: dict[int, list[Span]] = {}
    for s in spans:
        i = s.host // chunk
        groups.setdefault(i, []).append(replace(s, host=s.host - i * chunk))
    return groups


def write_from_engine(backend, items, path, header: bytes, nbytes: int, staging: np.ndarray, chunk: int,
                      mac_key: bytes) -> int:
    """Engine memory -> KV-disk file, one ``chunk`` of payload at a time through ``staging`` (disk thread)."""
    groups = _by_chunk(plan_spans(items, range(kvdisk.chunk_count(nbytes, chunk)), chunk), chunk)

    def pieces():
        for i in sorted(groups):
            backend.gather(groups[i], staging)
            yield staging[:min(chunk, nbytes - i * chunk)]

    return kvdisk.write_entry(path, header, pieces(), nbytes, mac_key, chunk)


def read_into_engine(backend, items, path, header: bytes, nbytes: int, staging: np.ndarray, chunk: int,
                     mac_key: bytes) -> None:
    """KV-disk file -> engine memory; each chunk is verified before it is copied on (disk thread)."""
    groups = _by_chunk(plan_spans(items, range(kvdisk.chunk_count(nbytes, chunk)), chunk), chunk)
    kvdisk.read_entry(path, header, nbytes, staging,
                      lambda offset, view: backend.scatter(groups[offset // chunk], staging), mac_key, chunk)


class Worker:
    """One thread running submitted jobs in order; ``post`` delivers each outcome to the server's loop."""

    def __init__(self, name: str, post: Callable[[Callable[[], None]], None]):
        self.name = name
        self._post = post
        self._jobs: queue.Queue = queue.Queue()
        self.in_flight = 0  # touched by the server's loop only (submit and the posted callbacks)
        self._thread = threading.Thread(target=self._run, name=f"tierd-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], object], done: Callable[[object, BaseException | None, float], None]) -> None:
        """Run ``job()`` on the thread; then ``done(result, error, seconds)`` runs on the server's loop."""
        self.in_flight += 1

        def finish(result, error, seconds):
            self.in_flight -= 1
            done(result, error, seconds)

        self._jobs.put((job, finish))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, finish = item
            t0 = time.perf_counter()
            try:
                result, error = job(), None
            except BaseException as e:  # reported to the loop, which decides what it means
                result, error = None, e
            seconds = time.perf_counter() - t0
            self._post(lambda f=finish, r=result, e=error, s=seconds: f(r, e, s))

    def close(self, timeout: float = 5.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)
