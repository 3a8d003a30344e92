"""The CUDA copy path's arithmetic on the CPU: CupyBackend with a host-memory stand-in for the runtime.

``HostRuntime.memcpy2DAsync`` does what cudaMemcpy2DAsync does (rows of
``width`` bytes, each side with its own pitch) with ctypes.memmove, and a
"device" block is a numpy buffer addressed by its raw pointer, as tierd
addresses an opened IPC handle. A mixed entry (device pages + host-slot
items) must move exactly the bytes the numpy backend moves.
"""

from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ignis.shared.tier_wire import BlockDesc
from ignis.tierd.copier import CupyBackend, NumpyBackend, coalesce, plan_spans
from ignis.tierd.memory_map import MappedBlock
from tests.tierd.test_copier import ArrayBlock, payload


class HostRuntime:
    memcpyDeviceToHost = 2
    memcpyHostToDevice = 1

    def __init__(self, max_pitch: int = 2**31 - 1):
        self.calls = 0
        self.row_calls = 0
        self.max_pitch = max_pitch

    def memcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind in (1, 2) and stream == 7
        assert width <= dpitch and width <= spitch, "a row wider than its pitch"
        assert dpitch <= self.max_pitch and spitch <= self.max_pitch, "cudaErrorInvalidPitchValue"
        self.calls += 1
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

    def memcpyAsync(self, dst, src, size, kind, stream):
        assert kind in (1, 2) and stream == 7
        self.row_calls += 1
        ctypes.memmove(dst, src, size)


class Stream:
    ptr = 7

    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


class FakeDeviceBlock(MappedBlock):
    """A "cuda_ipc" block whose device pointer is a host buffer's address; ``view`` only for checking."""

    kind = "cuda_ipc"

    def __init__(self, name, runs, items, item_bytes, pad=0):
        stride = items * item_bytes + pad
        super().__init__(BlockDesc(name, "cuda_ipc", "ab" * 64, runs, items, item_bytes, stride))
        self.raw = np.zeros(runs * stride, dtype=np.uint8)
        self.device_ptr = int(self.raw.ctypes.data)
        self.view = np.ndarray((runs, items, item_bytes), dtype=np.uint8, buffer=self.raw,
                               strides=(stride, item_bytes, 1))

    def close(self):
        pass


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_device_spans_move_the_same_bytes_as_numpy(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    pages = FakeDeviceBlock("kv", data.draw(st.integers(1, 6)), data.draw(st.integers(1, 5)),
                            data.draw(st.integers(1, 48)), pad=data.draw(st.integers(0, 9)))
    lanes = [ArrayBlock(f"slot{j}", data.draw(st.integers(1, 4)), 3, data.draw(st.integers(1, 30)))
             for j in range(2)]
    for b in (pages, *lanes):
        b.raw[:] = rng.integers(0, 256, b.raw.size, dtype=np.uint8)
    page_ids = data.draw(st.lists(st.integers(0, pages.items - 1), min_size=1, max_size=4, unique=True))
    slot = data.draw(st.integers(0, 2))
    items = [(pages, p) for p in page_ids] + [(b, slot) for b in lanes]
    block_bytes = data.draw(st.integers(1, 80))
    total = sum(b.item_total for b, _ in items)
    nblocks = -(-total // block_bytes)
    host_blocks = [int(x) for x in rng.permutation(nblocks + 2)[:nblocks]]
    spans = plan_spans(items, host_blocks, block_bytes)
    want = payload(items)

    max_pitch = data.draw(st.sampled_from([2**31 - 1, pages.run_stride, pages.run_stride - 1]))
    runtime, stream = HostRuntime(max_pitch), Stream()
    cuda = CupyBackend(runtime=runtime, stream=stream, max_pitch=max_pitch)
    host = np.zeros((nblocks + 2) * block_bytes, dtype=np.uint8)
    reference = host.copy()
    cuda.gather(spans, host)
    NumpyBackend().gather(spans, reference)
    assert host.tobytes() == reference.tobytes()
    got = b"".join(host[k * block_bytes:(k + 1) * block_bytes].tobytes() for k in host_blocks)[:total]
    assert got == want
    on_device = [s for s in spans if s.block is pages]
    if max_pitch >= pages.run_stride:
        two_d = [s for s in on_device if s.run_hi - s.run_lo > 1]
        rows = len(on_device) - len(two_d)
    else:
        two_d, rows = [], sum(s.run_hi - s.run_lo for s in on_device)
    assert (runtime.calls, runtime.row_calls) == (len(two_d), rows) and stream.synced == 1

    for b in (pages, *lanes):
        b.raw[:] = 0
    cuda.scatter(spans, host)
    assert payload(items) == want and stream.synced == 2


def test_host_only_entries_never_touch_the_device():
    lane = ArrayBlock("slot", 2, 2, 16)
    lane.raw[:] = np.arange(lane.raw.size, dtype=np.uint8)
    runtime, stream = HostRuntime(), Stream()
    spans = plan_spans([(lane, 1)], [0], 64)
    host = np.zeros(64, dtype=np.uint8)
    CupyBackend(runtime=runtime, stream=stream).gather(spans, host)
    assert host[:32].tobytes() == payload([(lane, 1)])
    assert runtime.calls == 0 and stream.synced == 0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_coalesced_device_spans_of_several_items_move_the_same_bytes(data):
    """What the store hands the backend: neighbouring pages merged into spans of several items."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    pages = FakeDeviceBlock("kv", data.draw(st.integers(1, 4)), 10, data.draw(st.integers(1, 32)),
                            pad=data.draw(st.integers(0, 5)))
    pages.raw[:] = rng.integers(0, 256, pages.raw.size, dtype=np.uint8)
    first = data.draw(st.integers(0, 5))
    items = [(pages, p) for p in range(first, first + data.draw(st.integers(1, 10 - first)))]
    block_bytes = pages.item_total * data.draw(st.sampled_from([1, 2]))
    nblocks = -(-sum(b.item_total for b, _ in items) // block_bytes)
    spans = coalesce(plan_spans(items, list(range(1, nblocks + 1)), block_bytes))
    assert len(spans) <= nblocks and any(s.n_items > 1 for s in spans) == (len(items) > 1)
    max_pitch = data.draw(st.sampled_from([2**31 - 1, pages.run_stride - 1]))
    runtime, stream = HostRuntime(max_pitch), Stream()
    cuda = CupyBackend(runtime=runtime, stream=stream, max_pitch=max_pitch)
    host = np.zeros((nblocks + 1) * block_bytes, dtype=np.uint8)
    reference = host.copy()
    cuda.gather(spans, host)
    NumpyBackend().gather(spans, reference)
    assert host.tobytes() == reference.tobytes()
    if pages.runs == 1:
        assert runtime.calls == 0 and runtime.row_calls == len(spans)  # one contiguous copy per span
    want = payload(items)
    pages.raw[:] = 0
    cuda.scatter(spans, host)
    assert payload(items) == want


def test_a_long_span_on_a_pool_wider_than_the_largest_pitch_is_one_copy_per_run():
    """A pool of more than 16K pages has runs wider than cudaDevAttrMaxPitch: a span of many pages goes
    as one 2D copy per run (rows: its pages, at a page's pitch), not one 1D copy per page and run."""
    pages = FakeDeviceBlock("kv", 4, 10, 16, pad=3)
    pages.raw[:] = np.random.default_rng(5).integers(0, 256, pages.raw.size, dtype=np.uint8)
    items = [(pages, p) for p in range(2, 9)]
    spans = coalesce(plan_spans(items, [0], 7 * pages.item_total))
    assert [s.n_items for s in spans] == [7]
    runtime, stream = HostRuntime(pages.run_stride - 1), Stream()
    cuda = CupyBackend(runtime=runtime, stream=stream, max_pitch=pages.run_stride - 1)
    host = np.zeros(7 * pages.item_total, dtype=np.uint8)
    cuda.gather(spans, host)
    assert host.tobytes() == payload(items)
    assert (runtime.calls, runtime.row_calls) == (4, 0)
    want = payload(items)
    pages.raw[:] = 0
    cuda.scatter(spans, host)
    assert payload(items) == want and (runtime.calls, runtime.row_calls) == (8, 0)


def test_a_short_span_takes_one_copy_per_page_where_the_run_stride_is_a_legal_pitch():
    """Fewer pages than runs (a fragmented pool's short spans): one 2D copy per page over its runs."""
    pages = FakeDeviceBlock("kv", 6, 10, 16, pad=3)
    pages.raw[:] = np.random.default_rng(6).integers(0, 256, pages.raw.size, dtype=np.uint8)
    items = [(pages, p) for p in range(4, 7)]
    spans = coalesce(plan_spans(items, [0], 3 * pages.item_total))
    assert [s.n_items for s in spans] == [3]
    for max_pitch, calls, row_calls in ((2**31 - 1, 3, 0), (pages.run_stride - 1, 6, 0)):
        runtime, stream = HostRuntime(max_pitch), Stream()
        host = np.zeros(3 * pages.item_total, dtype=np.uint8)
        CupyBackend(runtime=runtime, stream=stream, max_pitch=max_pitch).gather(spans, host)
        assert host.tobytes() == payload(items)
        assert (runtime.calls, runtime.row_calls) == (calls, row_calls)
