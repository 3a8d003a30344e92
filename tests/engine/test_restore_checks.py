"""Restored bytes are checked before use: a non-finite restore is dropped and the request recomputes.

The end-to-end case runs scheduler + store + runner on the demo model with a
real tierd behind them, and the fault hook (``IGNIS_ENGINE_FAULT_NAN_RESTORES``)
writing NaN into the first restored image: the request that would resume from
it gives the greedy tokens and logprobs of a reuse-off run (fp32, logprobs
within 1e-5 absolute), the request beside it finishes, and the entry is gone
here and in tierd.
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.eviction import Evicted, Evictor
from ignis.engine.metrics import EngineMetrics
from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.reuse.lower_index import content_key
from ignis.engine.tier_port import NullTierPort
from ignis.engine.tiers.restore_check import FAULT_NAN_RESTORE_ENV, finite_image, finite_pages, poison_image
from ignis.shared.demo import ensure_demo_model
from tests.engine.test_reuse import Engine, prompt
from tests.engine.test_tiers_e2e import Tierd
from tests.engine.test_tiers_logits import TieredEngine

LOGPROB_TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


def test_partial_last_page_is_checked_only_where_written(model):
    state = ModelState.allocate(model.cfg, num_pages=8, lanes=1, dtype=torch.float32, fill=float("nan"))
    state.allocate_slots(0, 2)
    state.pages[:, :, 3] = 0.0
    state.pages[:, :, 5, :36] = 0.0  # 100 tokens: page 3 whole, rows 0..35 of page 5
    assert finite_pages(state, [3, 5], 100)
    assert not finite_pages(state, [3, 5], 101)  # row 36 of page 5 was never written
    state.pages[1, 1, 5, 10, 0, 0] = float("inf")
    assert not finite_pages(state, [3, 5], 100)
    state.pages[1, 1, 5, 10, 0, 0] = 0.0
    state.pages[0, 0, 3, 63, 0, 0] = float("nan")
    assert not finite_pages(state, [3, 5], 100)
    for blocks in (state.slot_ssm, state.slot_conv):
        blocks[1].zero_()
    assert finite_image(state, 0) and finite_image(state, 1)
    poison_image(state, 1)
    assert finite_image(state, 0) and not finite_image(state, 1)
    state.close()


def test_an_exact_window_is_checked_only_in_the_rows_its_tokens_wrote(model):
    """hq-e8-2b images carry the exact-window ring (position p at row p % W): a sequence of n < W tokens
    wrote rows 0 .. n-1; the rest hold whatever the lane held (NaN here) and are not read."""
    state = ModelState.allocate(model.cfg, num_pages=4, lanes=1, dtype=torch.float32, fill=float("nan"),
                                kv_format="hq-e8-2b", exact_window=64)
    state.allocate_slots(0, 1)
    for blocks in (state.slot_ssm, state.slot_conv):
        blocks[1].zero_()
    window = state.slot_window[1][:, 0]  # [L_full, 2, W, Hkv, D]
    window.fill_(float("nan"))
    window[:, :, :39] = 0.0
    assert finite_image(state, 0, 39) and not finite_image(state, 0, 40) and not finite_image(state, 0)
    window[1, 1, 38, 0, 0] = float("inf")
    assert not finite_image(state, 0, 39)
    window[:] = 0.0
    assert finite_image(state, 0, 5000) and finite_image(state, 0)
    window[0, 0, 63, 0, 0] = float("nan")  # past W tokens every row holds one
    assert not finite_image(state, 0, 5000)
    state.close()


def test_many_pages_are_checked_a_group_at_a_time_and_each_group_counts(model, monkeypatch):
    """A long restore is gathered ``CHECK_PAGES`` pages at a time (a bounded temporary); a bad row in
    any group, the last included, fails the check."""
    from ignis.engine.tiers import restore_check

    monkeypatch.setattr(restore_check, "CHECK_PAGES", 3)
    gathered = []
    real = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select", lambda t, dim, idx: gathered.append(len(idx)) or real(t, dim, idx))
    state = ModelState.allocate(model.cfg, num_pages=12, lanes=1, dtype=torch.float32, fill=float("nan"))
    pages = [9, 0, 4, 7, 2, 11, 5, 1]
    for p in pages:
        state.pages[:, :, p] = 0.0
    assert finite_pages(state, pages, 8 * 64)
    assert gathered == [3, 3, 2]
    for bad in (9, 7, 1):  # in the first, a middle and the last group
        state.pages[1, 0, bad, 5, 0, 0] = float("nan")
        assert not finite_pages(state, pages, 8 * 64)
        state.pages[1, 0, bad, 5, 0, 0] = 0.0
    state.close()


class RejectingTier(NullTierPort):
    """A lower tier whose live copies come back at once, but not finite."""

    def __init__(self):
        self.dropped = []

    def restore_window(self, req_id, index, pages):
        return True

    def restore_image(self, req_id):
        return True

    def check_restored(self, pages, num_tokens, slot):
        return False

    def drop_window(self, req_id, index):
        self.dropped.append(("window", index))

    def drop_image(self, req_id):
        self.dropped.append(("image",))


class Held:
    req_id = "r"
    num_tokens = 151


def test_evicted_sequence_with_non_finite_restore_recomputes():
    from ignis.engine.page_pool import PagePool

    tier = RejectingTier()
    evictor = Evictor(tier, window_pages=2, staging_slot=4)
    pool = PagePool(8)
    record = Evicted(computed=150, windows=[[1, 2], [3]], image=True, next_page=3)
    assert evictor.prepare(Held(), record, pool) == "failed"
    assert (evictor.restore_rejections, evictor.resumes) == (1, 0)
    assert tier.dropped == [("window", 0), ("window", 1), ("image",)]  # nothing of it stays below
    assert pool.num_free == 8 and evictor.staging_user is None  # the reserved pages and the slot are free
    pool.integrity_check()


def test_non_finite_restore_is_dropped_and_recomputed(tmp_path, model, monkeypatch):
    tierd = Tierd(tmp_path, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    monkeypatch.setenv(FAULT_NAN_RESTORE_ENV, "1")
    eng = TieredEngine(model, tierd.endpoint)
    monkeypatch.delenv(FAULT_NAN_RESTORE_ENV)
    try:
        p = prompt(300, 11)
        eng.serve_then_demote(p, system_end=200, opener_start=297)
        held = {r.key for r in eng.sched.store.lower.matches(tuple(p), len(p) - 1, longer_than=0)}
        assert content_key(tuple(p[:297])) in held
        eng.submit("again", p, system_end=200, opener_start=297, max_tokens=8)
        eng.submit("beside", prompt(120, 77), max_tokens=8)
        eng.run(logprobs=True)
        again, beside = eng.finished["again"], eng.finished["beside"]
        assert again.reason == "length" and beside.reason == "length"
        assert again.restore_rejected == 1 and again.reuse_tier not in ("kv_ram", "kv_disk")
        assert eng.sched.stats()["reuse_restore_rejected_total"] == 1
        gone = eng.client.wait(eng.client.lookup([content_key(tuple(p[:297]))]))
        assert gone.value == {content_key(tuple(p[:297])): None}
        metrics = EngineMetrics("demo")
        metrics.sync_store(eng.sched.stats())
        assert 'ignis:reuse_restore_rejected_total{model_name="demo",reason="non_finite"} 1.0' in \
            metrics.render().decode()

        cold = Engine(model, reuse=False)
        cold.submit("cold", p, max_tokens=8)
        cold.run(logprobs=True)
        assert eng.tokens["again"] == cold.tokens["cold"]
        assert max(abs(a - b) for a, b in zip(eng.logprobs["again"], cold.logprobs["cold"])) < LOGPROB_TOL
        assert len(eng.logprobs["again"]) == len(cold.logprobs["cold"]) == 8

        eng.sched.store.release_all()
        assert eng.sched.pool.num_free == eng.sched.pool.num_pages
        assert eng.sched.store.slots.num_free == eng.sched.store.slots.total
        eng.sched.pool.integrity_check()
    finally:
        eng.client.close()
        eng.runner.state.close()
        assert tierd.stop() == 0
