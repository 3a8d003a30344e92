"""Fault: every tier full at once. A tiny KV pool, a KV-RAM arena and a KV-disk budget too small for
any entry, and a burst of requests needing several times the pool: the burst queues, no request
fails, requests start in the order they arrived (one class), and every output equals its cold run.

Already covered elsewhere: full lower tiers with one request at a time
(tests/engine/test_tiers_e2e.py::test_full_lower_tiers_cause_no_crash), and
tierd refusing demotes it has no room for (tests/tierd/test_tierd_pressure.py).
"""

from __future__ import annotations

import time

from tests.engine.engine_process import EngineProcess
from tests.engine.test_tiers_e2e import prompt
from tests.tierd.fake_engine import TierdProcess

BURST = 6
PROMPT_TOKENS = 300
MAX_TOKENS = 6


def test_a_burst_over_every_tier_queues_drains_in_arrival_order_and_equals_cold(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64K")  # room for nothing
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2")
    try:
        prompts = [prompt(PROMPT_TOKENS, 700 + i) for i in range(BURST)]
        assert BURST * (PROMPT_TOKENS + MAX_TOKENS) > 1024  # more than the pool holds
        cold = [eng.run(f"cold{i}", p, max_tokens=MAX_TOKENS, ignore_eos=True).tokens for i, p in enumerate(prompts)]
        rids = [f"burst{i}" for i in range(BURST)]
        for rid, p in zip(rids, prompts):
            eng.generate(rid, p, max_tokens=MAX_TOKENS, ignore_eos=True)
        started: dict[str, int] = {}  # rid -> the pump in which its first token arrived
        pumps = 0
        deadline = time.monotonic() + 120
        while not all(eng.outcomes[r].done for r in rids):
            assert time.monotonic() < deadline, eng.log_text()
            eng.pump()
            pumps += 1
            for r in rids:
                if r not in started and eng.outcomes[r].batches:
                    started[r] = pumps
        outs = [eng.outcomes[r] for r in rids]
        assert all(o.refused is None for o in outs), [o.refused for o in outs]
        assert [o.finished.finish_reason for o in outs] == ["length"] * BURST
        assert [o.tokens for o in outs] == cold
        order = [started[r] for r in rids]
        assert order == sorted(order), order  # first tokens in arrival order (ties: the same batch)
        stats = eng.stats()
        assert stats["reuse_demotions_total"] == 0, stats  # the lower tiers took nothing
        assert tierd.metric("ignis:tierd_refusals_total", reason="no_room") >= 1, tierd.log_text()  # and were asked
        assert eng.wait_pool_full()["num_requests_running"] == 0
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0
