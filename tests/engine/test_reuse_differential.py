"""Differential reuse: random mixes of requests on a reuse-on engine give a reuse-off engine's outputs.

Both families (tiny random Qwen3.5 dense and Qwen3-Next MoE checkpoints), a
small pool, few lanes and slots, and a real tierd with a small arena and a
small KV-disk ceiling behind them. Hypothesis draws the engine's shape and a
list of operations (``tests.support.reuse_diff``: bursts, multi-turn
conversations, retries, forks, aborts, long prompts, rounds in between; a
conversation or burst may carry a cache salt, and a request resumed only
state a request of its own salt made); every
finished request's greedy tokens and logprobs are compared with the same
prompt run alone on a reuse-off engine (logprobs within 1e-4 absolute), and
the engine must drain with every page and slot free. A failure prints the
shrunk operation list: ``run_ops`` replays it as it is.

``IGNIS_LONG_TESTS=1`` also runs the long mode (marked ``long``): many more and longer examples.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.engine.models.build import load_model
from tests.engine.test_tiers_e2e import Tierd
from collections import Counter

from tests.support.reuse_diff import Config, Driver, References, compare, coverage, run_ops

LONG = os.environ.get("IGNIS_LONG_TESTS") == "1"

_stamps = itertools.count()

configs = st.builds(Config, lanes=st.integers(1, 3), pages=st.sampled_from([8, 12, 16]),
                    device_slots=st.integers(0, 1), host_slots=st.integers(1, 3),
                    budget=st.sampled_from([48, 100, 4096]), window=st.integers(1, 2), tiers=st.just(True))

SALTS = st.sampled_from([None, None, "tenant-a", "tenant-b"])
"""A conversation's or a burst's cache salt (its turns, retries and forks keep it): mostly none."""

ops = st.one_of(
    st.tuples(st.just("new"), st.integers(0, 2), st.integers(1, 120), st.integers(0, 30),
              st.sampled_from(["interactive", "agent"]), st.sampled_from([1, 4, 8, 40]), SALTS),
    st.tuples(st.just("turn"), st.integers(0, 5), st.integers(1, 60), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("retry"), st.integers(0, 20)),
    st.tuples(st.just("fork"), st.integers(0, 20), st.integers(1, 40), st.integers(0, 30)),
    st.tuples(st.just("burst"), st.integers(0, 2), st.integers(2, 4), st.integers(0, 30), SALTS),
    st.tuples(st.just("long"), st.integers(0, 30)),
    st.tuples(st.just("urgent"), st.integers(0, 2), st.integers(1, 60), st.integers(0, 30)),
    st.tuples(st.just("squeeze"), st.integers(0, 30)),
    st.tuples(st.just("abort"), st.integers(0, 20)),
    st.tuples(st.just("step"), st.integers(1, 6)),
)


@pytest.fixture(scope="module")
def tierd(tmp_path_factory):
    rt = tmp_path_factory.mktemp("diff-rt")
    # an arena of about two small entries, a KV-disk ceiling of about ten
    t = Tierd(rt, "--reuse-kv-host-pool-bytes", "256K", "--kv-disk-bytes", "1M")
    yield t.endpoint
    assert t.stop() == 0


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def family_model(request, checkpoint_factory):
    model, _ = load_model(checkpoint_factory(request.param).path)
    return request.param, model, References(model, request.param)


def check(family, model, refs, endpoint, cfg, op_list, seen=None):
    drv = Driver(model, family, cfg, endpoint=endpoint, stamp=f"diff-{family}-{next(_stamps)}")
    try:
        run_ops(drv, op_list)
        compare(drv, refs)
        if seen is not None:
            seen.update(coverage(drv))
        drv.check_drained()
    finally:
        drv.close()


def _explore(family_model, endpoint, examples, steps, cfgs=configs):
    """``examples`` runs of up to ``steps`` operations each."""
    family, model, refs = family_model
    seen = Counter()

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(cfg=cfgs, op_list=st.lists(ops, min_size=1, max_size=steps))
    def run(cfg, op_list):
        check(family, model, refs, endpoint, cfg, op_list, seen)

    run()
    print(f"{family}: {dict(seen)}, {refs.runs} reference runs")
    return seen


def test_reuse_on_equals_reuse_off(family_model, tierd):
    seen = _explore(family_model, tierd, examples=70, steps=16)
    # the runs compared reused from every tier and went through live eviction and aborts (with a tier,
    # decode-time pressure evicts instead of preempting)
    for what in ("hit_device", "hit_kv_ram", "hit_kv_disk", "restores", "live_evictions", "aborted", "hit_salted"):
        assert seen[what] > 0, (what, dict(seen))


def test_reuse_on_equals_reuse_off_without_a_tier(family_model):
    """No tierd: pool pressure preempts (recompute from the prompt and the output so far) among reuse."""
    seen = _explore(family_model, None, examples=12, steps=16, cfgs=configs.map(lambda c: replace(c, tiers=False)))
    for what in ("hit_device", "preemptions"):
        assert seen[what] > 0, (what, dict(seen))


REPLAYS = {
    # a burst of the same system block on a pool of 8 pages, prefill budget 48: the second request must
    # not resume from the first one's retained prefix before the round that fills its slot is applied
    "pending_capture": (Config(lanes=2, pages=8, device_slots=0, host_slots=1, budget=48, window=1),
                        [("new", 0, 1, 0, "interactive", 1)] * 8),
    # a retry and a next turn resume from checkpoints whose last page is partial (its private copy must be
    # filled after the capturing forward)
    "partial_page": (Config(lanes=1, pages=8, device_slots=0, host_slots=1, budget=48, window=1),
                     [("retry", 0), ("retry", 0), ("retry", 0), ("new", 0, 1, 0, "interactive", 1),
                      ("new", 1, 1, 0, "agent", 1), ("new", 0, 1, 0, "interactive", 1), ("turn", 0, 1, 0, False),
                      ("new", 1, 1, 0, "interactive", 1)]),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_replay(family_model, tierd, name):
    """Shrunk failures the harness printed (with a reuse rule broken by hand), kept as fixed cases."""
    family, model, refs = family_model
    cfg, op_list = REPLAYS[name]
    check(family, model, refs, tierd, cfg, op_list)


@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="long mode: IGNIS_LONG_TESTS=1")
def test_reuse_on_equals_reuse_off_long(family_model, tierd):
    _explore(family_model, tierd, examples=300, steps=40)
