"""A prompt resumed from KV-RAM or KV-disk gives the logits of a cold prefill (fp32, 1e-5 relative).

In one process: scheduler + store + runner on the demo model, with the pool
and host slots in shared memory and a real tierd process behind them.
"""

from __future__ import annotations

import pytest
import torch

from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE
from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.engine.tiers.wiring import connect_tiers
from tests.engine.test_reuse import Engine, prompt, rel
from tests.engine.test_tiers_e2e import Tierd


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


class TieredEngine(Engine):
    def __init__(self, model, endpoint, pages=16, lanes=2, host_slots=4, device_slots=0):
        state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32,
                                    fill=float("nan"), shared=True)
        state.allocate_slots(device_slots, host_slots)
        port = connect_tiers(state, endpoint, "logits-test", "qwen3_5", device_slots=device_slots,
                             staging_slot=None)
        assert port is not None and port.client.welcome is not None
        self.client = port.client
        self.sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                               max_prefill_tokens_per_round=4096), device_slots=device_slots,
                               host_slots=host_slots, tiers=port, restore_floors={"ram": 64, "disk": 64})
        self.runner = ModelRunner(model, state, vocab_limit=TOKENIZER_SIZE)
        self.first_logits, self.tokens, self.logprobs, self.finished = {}, {}, {}, {}
        self.prefilled = 0

    def serve_then_demote(self, p, system_end, opener_start):
        """Serves ``p`` (request "a"), then unrelated work that needs the room: its retained entries move down."""
        self.submit("a", p, system_end=system_end, opener_start=opener_start)
        self.run()
        for i in range(2):
            self.submit(f"fill{i}", prompt(900, 30 + i), max_tokens=2)
            self.run()
        assert self.sched.store.demotions >= 1


@pytest.mark.parametrize("tier", ["kv_ram", "kv_disk"])
def test_lower_tier_resume_matches_cold_prefill(tmp_path, model, tier):
    flags = ["--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0"] if tier == "kv_ram" else \
        ["--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64M"]
    tierd = Tierd(tmp_path, *flags)
    eng = TieredEngine(model, tierd.endpoint)
    try:
        p = prompt(300, 11)
        eng.serve_then_demote(p, system_end=200, opener_start=297)
        eng.submit("again", p, system_end=200, opener_start=297)
        eng.run()
        ev = eng.finished["again"]
        assert (ev.cached_tokens, ev.reuse_tier) == (297, tier)
        cold = Engine(model, reuse=False)
        cold.submit("cold", p)
        cold.run()
        err = rel(eng.first_logits["again"], cold.first_logits["cold"])
        print(f"{tier} resume vs cold rel err {err:.2e}")
        assert err < 1e-5
        assert eng.tokens["again"] == cold.tokens["cold"]
        eng.sched.store.release_all()
        assert eng.sched.pool.num_free == eng.sched.pool.num_pages
        eng.sched.pool.integrity_check()
    finally:
        eng.client.close()
        eng.runner.state.close()
        assert tierd.stop() == 0


@pytest.mark.parametrize("device_slot", ["held", "free"])
def test_with_device_slots_a_host_slot_entry_demotes_and_resumes_from_kv_ram(tmp_path, model, device_slot):
    """``--reuse-device-slots 1`` with a tierd: the retained prefix takes the device slot, the checkpoint a
    host slot (host item 0). Under pressure the checkpoint moves to KV-RAM (a device-slot image is never
    exported). Another conversation then takes the device slot and host item 0 (``held``), and the retry
    resumes from KV-RAM into another host slot with the logits and greedy tokens of a cold prefill."""
    tierd = Tierd(tmp_path, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = TieredEngine(model, tierd.endpoint, device_slots=1)
    store = eng.sched.store
    try:
        p = prompt(300, 12)
        eng.submit("a", p, system_end=200, opener_start=297)
        eng.run()
        assert sorted((e.kind, e.slot) for e in store.entries()) == [("prompt_checkpoint", 1), ("retained_prefix", 0)]
        for i in range(2):
            eng.submit(f"fill{i}", prompt(900, 40 + i), max_tokens=2)
            eng.run()
        assert store.demotions == 1 and len(store.lower) == 1
        if device_slot == "held":
            eng.submit("hold", prompt(150, 13), system_end=140, opener_start=147, max_tokens=2)
            eng.run()
            assert sorted(e.slot for e in store.entries()) == [0, 1]
        eng.submit("again", p, system_end=200, opener_start=297)
        eng.run()
        ev = eng.finished["again"]
        assert (ev.cached_tokens, ev.reuse_tier, ev.reuse_slot) == (297, "kv_ram", "host")
        cold = Engine(model, reuse=False)
        cold.submit("cold", p)
        cold.run()
        err = rel(eng.first_logits["again"], cold.first_logits["cold"])
        print(f"device slots 1, kv_ram resume vs cold rel err {err:.2e}")
        assert err < 1e-5
        assert eng.tokens["again"] == cold.tokens["cold"]
        store.release_all()
        assert eng.sched.pool.num_free == eng.sched.pool.num_pages
        eng.sched.pool.integrity_check()
    finally:
        eng.client.close()
        eng.runner.state.close()
        assert tierd.stop() == 0


def test_closing_the_runtime_detaches_from_tierd_before_the_memory_goes(tmp_path, model):
    """Runtime.close says goodbye (tierd drops our entries and unmaps the pool and slots) and only then
    frees the shared blocks: after it, an engine of another name is welcome, which tierd allows only once
    the first one has detached."""
    from ignis.engine.runtime import Runtime

    tierd = Tierd(tmp_path, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = TieredEngine(model, tierd.endpoint)
    order = []
    bye, close_state = eng.client.bye, eng.runner.state.close
    eng.client.bye = lambda: order.append("bye") or bye()
    eng.runner.state.close = lambda: order.append("free") or close_state()
    try:
        eng.submit("a", prompt(300, 11), system_end=200, opener_start=297)
        eng.run()
        Runtime("demo", eng.runner, eng.sched, eng.client, {}, TOKENIZER_SIZE).close()
        assert order == ["bye", "free"]
        other = ModelState.allocate(model.cfg, num_pages=4, lanes=1, dtype=torch.float32, shared=True)
        other.allocate_slots(0, 1)
        port = connect_tiers(other, tierd.endpoint, "logits-test", "qwen3_5", device_slots=0, staging_slot=None,
                             engine_id="another-instance")
        try:
            assert port is not None and port.client.welcome is not None
        finally:
            if port is not None:
                port.client.close()
            other.close()
    finally:
        assert tierd.stop() == 0
