"""A cold burst of subagents sharing one system block: every output equals its cold output.

Siblings admitted in the round whose forward fills a retained-prefix capture
must not resume from it before that round is applied (its slot holds nothing
yet): they wait for it, then resume, so the shared block is prefilled once.
"""

from __future__ import annotations

import pytest

from tests.engine.test_reuse import Engine, model, prompt, rel  # noqa: F401 - model is a fixture

TOL = 1e-5
SYSTEM = 150  # the retained prefix is its whole pages: 128 tokens


def cold_run(model, rid, p):
    cold = Engine(model, reuse=False, lanes=1)
    cold.submit(rid, p)
    cold.run()
    return cold.tokens[rid], cold.first_logits[rid]


@pytest.mark.parametrize("budget", [4096, 300])
def test_cold_burst_outputs_equal_cold_runs_and_block_prefilled_once(model, budget):
    system = prompt(SYSTEM, 40)
    prompts = {f"sub{i}": system + prompt(20 + 7 * i, 50 + i) for i in range(7)}
    eng = Engine(model, lanes=8, host_slots=8, prefill_budget=budget)
    for rid, p in prompts.items():
        eng.submit(rid, p, system_end=SYSTEM, opener_start=len(p) - 3, cls="agent")
    prefilled = 0
    original = eng.runner.run

    def counting_run(plan):
        nonlocal prefilled
        prefilled += sum(c.num_tokens for c in plan.prefills)
        return original(plan)

    eng.runner.run = counting_run
    eng.run()
    for rid, p in prompts.items():
        tokens, logits = cold_run(model, rid, p)
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    hits = [eng.finished[rid].cached_tokens for rid in prompts]
    assert sorted(hits) == [0] + [128] * 6, hits
    tails = sum(len(p) - 128 for p in prompts.values())
    assert prefilled == 128 + tails, (prefilled, tails)
    eng.check_drained()
