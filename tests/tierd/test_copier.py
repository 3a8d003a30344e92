"""Copy plans: spans cover every byte once, at the right place, for any item, run and block sizes."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ignis.shared.tier_wire import BlockDesc
from ignis.tierd.copier import NumpyBackend, ParallelBackend, Worker, coalesce, plan_spans, split
from ignis.tierd.memory_map import MappedBlock


class ArrayBlock(MappedBlock):
    """A MappedBlock over a private numpy array (no shared memory needed for the span arithmetic)."""

    kind = "shm"

    def __init__(self, name, runs, items, item_bytes, pad=0):
        stride = items * item_bytes + pad
        super().__init__(BlockDesc(name, "shm", "x", runs, items, item_bytes, stride))
        self.raw = np.zeros(runs * stride, dtype=np.uint8)
        self.view = np.ndarray((runs, items, item_bytes), dtype=np.uint8, buffer=self.raw,
                               strides=(stride, item_bytes, 1))

    def close(self):
        pass


def payload(items):
    return b"".join(b.view[:, i, :].tobytes() for b, i in items)


def test_a_page_aligned_item_is_one_span_per_block():
    kv = ArrayBlock("kv", runs=4, items=3, item_bytes=8)
    spans = plan_spans([(kv, 2), (kv, 0)], [5, 1], block_bytes=32)
    assert [(s.item, s.run_lo, s.run_hi, s.col_lo, s.col_hi, s.host) for s in spans] == [
        (2, 0, 4, 0, 8, 160), (0, 0, 4, 0, 8, 32)]


def test_an_item_straddling_blocks_is_cut_into_rectangles():
    lane = ArrayBlock("ssm", runs=3, items=2, item_bytes=10)
    spans = plan_spans([(lane, 1)], [0, 7], block_bytes=16)  # item bytes 0..30 over 16 + 14
    assert [(s.run_lo, s.run_hi, s.col_lo, s.col_hi, s.host) for s in spans] == [
        (0, 1, 0, 10, 0), (1, 2, 0, 6, 10), (1, 2, 6, 10, 112), (2, 3, 0, 10, 116)]
    assert sum(s.nbytes for s in spans) == 30


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_gather_then_scatter_round_trips_any_layout(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    blocks = [ArrayBlock(f"b{j}", data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4)),
                         data.draw(st.integers(1, 40)), pad=data.draw(st.integers(0, 7))) for j in range(3)]
    for b in blocks:
        b.raw[:] = rng.integers(0, 256, b.raw.size, dtype=np.uint8)
    pairs = [(j, i) for j, b in enumerate(blocks) for i in range(b.items)]
    chosen = data.draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=6, unique=True))
    items = [(blocks[j], i) for j, i in chosen]
    block_bytes = data.draw(st.integers(1, 64))
    total = sum(b.item_total for b, _ in items)
    nblocks = -(-total // block_bytes)
    host_blocks = [int(x) for x in rng.permutation(nblocks + 3)[:nblocks]]
    host = np.zeros((nblocks + 3) * block_bytes, dtype=np.uint8)
    spans = plan_spans(items, host_blocks, block_bytes)
    assert sum(s.nbytes for s in spans) == total
    want = payload(items)
    NumpyBackend().gather(spans, host)
    got = b"".join(host[k * block_bytes:(k + 1) * block_bytes].tobytes() for k in host_blocks)[:total]
    assert got == want
    for b in blocks:
        b.raw[:] = 0
    NumpyBackend().scatter(spans, host)
    assert payload(items) == want


def test_worker_runs_jobs_in_order_and_reports_errors():
    posted, seen = [], []
    lock = threading.Event()

    def post(fn):
        posted.append(fn)
        if len(posted) == 3:
            lock.set()

    w = Worker("test", post)
    w.submit(lambda: 1, lambda r, e, s: seen.append((r, e)))
    w.submit(lambda: 1 / 0, lambda r, e, s: seen.append((r, type(e))))
    w.submit(lambda: 3, lambda r, e, s: seen.append((r, e)))
    assert lock.wait(5) and w.in_flight == 3
    for fn in posted:
        fn()
    assert seen == [(1, None), (None, ZeroDivisionError), (3, None)] and w.in_flight == 0
    w.close()


def test_neighbouring_pages_coalesce_into_one_copy_with_the_same_bytes():
    for runs in (1, 3):
        kv = ArrayBlock("kv", runs=runs, items=8, item_bytes=16)
        kv.raw[:] = np.arange(kv.raw.size, dtype=np.uint8)
        items = [(kv, i) for i in (2, 3, 4, 5, 0)]
        spans = plan_spans(items, [4, 5, 6, 7, 1], block_bytes=16 * runs)
        merged = coalesce(spans)
        assert len(spans) == 5 and len(merged) == 2  # items 2..5 into blocks 4..7, then item 0
        assert (merged[0].item, merged[0].n_items, merged[0].host) == (2, 4, 4 * 16 * runs)
        a, b = np.zeros(8 * 16 * runs, dtype=np.uint8), np.zeros(8 * 16 * runs, dtype=np.uint8)
        NumpyBackend().gather(spans, a)
        NumpyBackend().gather(merged, b)
        assert np.array_equal(a, b)


def test_rows_of_one_item_split_over_neighbouring_blocks_coalesce():
    lane = ArrayBlock("ssm", runs=4, items=2, item_bytes=8)
    spans = plan_spans([(lane, 1)], [3, 4], block_bytes=16)  # rows 0-1 in block 3, rows 2-3 in block 4
    assert [(s.run_lo, s.run_hi, s.n_items) for s in coalesce(spans)] == [(0, 4, 1)]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_coalesced_split_and_parallel_copies_move_the_same_bytes(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kv = ArrayBlock("kv", data.draw(st.integers(1, 4)), 12, data.draw(st.integers(1, 24)), pad=data.draw(st.integers(0, 5)))
    kv.raw[:] = rng.integers(0, 256, kv.raw.size, dtype=np.uint8)
    chosen = data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True))
    items = [(kv, i) for i in chosen]
    block_bytes = data.draw(st.integers(1, 64))
    nblocks = -(-sum(b.item_total for b, _ in items) // block_bytes)
    host_blocks = sorted(int(x) for x in rng.permutation(nblocks + 2)[:nblocks])
    spans = plan_spans(items, host_blocks, block_bytes)
    want = np.zeros((nblocks + 2) * block_bytes, dtype=np.uint8)
    NumpyBackend().gather(spans, want)
    merged = coalesce(spans)
    assert len(merged) <= len(spans) and sum(s.nbytes for s in merged) == sum(s.nbytes for s in spans)
    parts = split(merged, data.draw(st.integers(1, 5)))
    assert sum(s.nbytes for p in parts for s in p) == sum(s.nbytes for s in spans)
    got = np.zeros_like(want)
    for p in parts:
        NumpyBackend().gather(p, got)
    assert np.array_equal(got, want)
    backend = ParallelBackend(NumpyBackend(), 3)
    try:
        got[:] = 0
        backend.gather(merged, got)
        assert np.array_equal(got, want)
        before = payload(items)
        kv.raw[:] = 0
        for p in parts:
            NumpyBackend().scatter(p, want)
        assert payload(items) == before
    finally:
        backend.close()


def test_a_large_copy_runs_in_parts_on_several_threads_with_the_same_bytes(monkeypatch):
    import ignis.tierd.copier as copier

    monkeypatch.setattr(copier, "PARALLEL_MIN_BYTES", 0)
    kv = ArrayBlock("kv", runs=3, items=64, item_bytes=32)
    kv.raw[:] = np.random.default_rng(1).integers(0, 256, kv.raw.size, dtype=np.uint8)
    items = [(kv, i) for i in range(64)]
    spans = coalesce(plan_spans(items, list(range(64)), block_bytes=96))
    seen = []

    class Recording(NumpyBackend):
        def gather(self, spans, host):
            seen.append(threading.get_ident())
            super().gather(spans, host)

    backend = ParallelBackend(Recording(), 4)
    try:
        host = np.zeros(64 * 96, dtype=np.uint8)
        backend.gather(spans, host)
        assert host.tobytes() == payload(items) and len(split(spans, 4)) == 4
        assert len(seen) == 4 and seen.count(threading.get_ident()) == 1  # one part here, three on the pool
        kv.raw[:] = 0
        backend.scatter(spans, host)
        assert payload(items) == host.tobytes()
    finally:
        backend.close()
