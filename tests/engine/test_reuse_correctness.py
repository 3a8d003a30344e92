"""Reused requests produce their cold outputs: bursts of subagents and long conversations.

Siblings admitted in the round whose forward fills a retained-prefix capture
must not resume from it before that round is applied (its slot holds nothing
yet): they wait for it, then resume, so the shared block is prefilled once.
A conversation resumed turn after turn keeps at most two checkpoints.
"""

from __future__ import annotations

import pytest

from tests.engine.test_reuse import Engine, model, prompt, rel  # noqa: F401 - model is a fixture

TOL = 1e-5
CONVERSATION_TOL = 5e-5
"""A turn resumed from a chain of checkpoints was prefilled in up to ten pieces where the
cold run took one: fp32 summation order differs more (1.1e-5 measured at turn 4)."""
SYSTEM = 150  # the retained prefix is its whole pages: 128 tokens


def cold_run(model, rid, p, max_tokens=6):
    cold = Engine(model, reuse=False, lanes=1, pages=96)
    cold.submit(rid, p, max_tokens=max_tokens)
    cold.run()
    return cold.tokens[rid], cold.first_logits[rid]


@pytest.mark.parametrize("budget", [4096, 300])
def test_cold_burst_outputs_equal_cold_runs_and_block_prefilled_once(model, budget):
    system = prompt(SYSTEM, 40)
    prompts = {f"sub{i}": system + prompt(20 + 7 * i, 50 + i) for i in range(7)}
    eng = Engine(model, lanes=8, host_slots=8, prefill_budget=budget)
    for rid, p in prompts.items():
        eng.submit(rid, p, system_end=SYSTEM, opener_start=len(p) - 3, cls="agent")
    eng.run()
    for rid, p in prompts.items():
        tokens, logits = cold_run(model, rid, p)
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    hits = [eng.finished[rid].cached_tokens for rid in prompts]
    assert sorted(hits) == [0] + [128] * 6, hits
    tails = sum(len(p) - 128 for p in prompts.values())
    assert eng.prefilled == 128 + tails, (eng.prefilled, tails)
    eng.check_drained()


def test_ten_turn_conversation_keeps_two_checkpoints_and_cold_outputs(model):
    system = prompt(140, 60)
    history = list(system)
    eng = Engine(model, pages=96, lanes=2, host_slots=8)
    for turn in range(10):
        after_user = turn % 3 == 0  # a user message, then tool results
        p = history + prompt(25, 70 + turn) + [7, 8, 9]  # [7, 8, 9]: the generation opener
        rid = f"turn{turn}"
        eng.submit(rid, p, system_end=len(system), opener_start=len(p) - 3, last_is_user=after_user, max_tokens=4)
        eng.run()
        checkpoints = [e for e in eng.sched.store.entries() if e.kind == "prompt_checkpoint"]
        assert len(checkpoints) <= 2, (turn, [e.num_tokens for e in checkpoints])
        if turn:
            assert eng.finished[rid].cached_tokens > len(system), turn
        tokens, logits = cold_run(model, rid, p, max_tokens=4)
        assert eng.tokens[rid] == tokens, turn
        assert rel(eng.first_logits[rid], logits) < CONVERSATION_TOL, turn
        history = p + eng.tokens[rid]
    eng.check_drained()


def test_a_cold_agent_burst_takes_a_slot_from_idle_interactive_entries(model):
    """Every slot holds an idle interactive checkpoint; a burst of agent subagents arrives on a fresh
    system block. Its retained prefix is read by the siblings waiting in the queue, so it claims a slot
    as an interactive capture would: the block is prefilled once, and every output is the cold one."""
    system = prompt(SYSTEM, 41)
    eng = Engine(model, lanes=4, host_slots=2)
    for i in range(2):
        chat = prompt(90, 80 + i)
        eng.submit(f"chat{i}", chat, opener_start=len(chat) - 3, max_tokens=2)
    eng.run()
    assert {e.request_class for e in eng.sched.store.entries()} == {"interactive"}
    assert eng.sched.store.slots.num_free == 0
    prompts = {f"sub{i}": system + prompt(20 + 5 * i, 60 + i) for i in range(4)}
    for rid, p in prompts.items():
        eng.submit(rid, p, system_end=SYSTEM, opener_start=len(p) - 3, cls="agent")
    eng.prefilled = 0  # count the burst's prefill only
    eng.run()
    assert sorted(eng.finished[rid].cached_tokens for rid in prompts) == [0, 128, 128, 128]
    assert eng.prefilled == 128 + sum(len(p) - 128 for p in prompts.values())
    for rid, p in prompts.items():
        tokens, logits = cold_run(model, rid, p)
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    eng.check_drained()


def test_a_retry_arriving_with_its_original_waits_for_the_pending_checkpoint(model):
    """Two requests with the same prompt arrive together: the first's checkpoint is captured in the round
    that admits both, so the second waits one round for it to be filled, resumes from it (never from the
    unfilled slot) and the prompt is prefilled once; both give the cold outputs."""
    p = prompt(203, 90)
    eng = Engine(model, lanes=2, host_slots=4)
    eng.submit("first", p, opener_start=200)
    eng.submit("retry", p, opener_start=200)
    eng.run()
    assert (eng.finished["first"].cached_tokens, eng.finished["retry"].cached_tokens) == (0, 200)
    assert eng.prefilled == 203 + 3
    tokens, logits = cold_run(model, "cold", p)
    for rid in ("first", "retry"):
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    eng.check_drained()


def test_siblings_wait_while_the_first_prefills_towards_the_block_with_nothing_pending(model):
    """The first of an agent burst cuts its prefill at a point inside the system block (a part boundary at
    64) whose capture is skipped (every slot holds an interactive checkpoint), so for a round nothing is
    pending; the siblings still wait for the retained prefix it is prefilling towards, then resume from it:
    the block is prefilled once and every output is the cold one."""
    system = prompt(SYSTEM, 42)
    eng = Engine(model, lanes=4, host_slots=2)
    for i in range(2):
        chat = prompt(90, 85 + i)
        eng.submit(f"chat{i}", chat, opener_start=len(chat) - 3, max_tokens=2)
    eng.run()
    assert eng.sched.store.slots.num_free == 0
    prompts = {f"sub{i}": system + prompt(20 + 5 * i, 95 + i) for i in range(3)}
    for rid, p in prompts.items():
        eng.submit(rid, p, system_end=SYSTEM, opener_start=len(p) - 3, cls="agent", part_end=64)
    eng.prefilled = 0  # count the burst's prefill only
    eng.run()
    assert sorted(eng.finished[rid].cached_tokens for rid in prompts) == [0, 128, 128]
    assert eng.prefilled == 128 + sum(len(p) - 128 for p in prompts.values())
    for rid, p in prompts.items():
        tokens, logits = cold_run(model, rid, p)
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    eng.check_drained()


@pytest.mark.parametrize("budget", [4096, 300])
def test_a_burst_sharing_a_user_preamble_reads_it_once(model, budget):
    """Seven requests arrive together sharing 150 tokens no mark predicts (the same task preamble at the
    start of each user message; no system block): the first captures where the second diverges from it
    (two whole pages), the others wait for that capture and resume from it. The preamble is prefilled
    once, and every output is the cold one."""
    preamble = prompt(SYSTEM, 43)
    prompts = {f"sub{i}": preamble + prompt(20 + 7 * i, 110 + i) for i in range(7)}
    eng = Engine(model, lanes=8, host_slots=8, prefill_budget=budget)
    for rid, p in prompts.items():
        eng.submit(rid, p, opener_start=len(p) - 3, cls="agent")
    eng.run()
    hits = [eng.finished[rid].cached_tokens for rid in prompts]
    assert sorted(hits) == [0] + [128] * 6, hits
    assert eng.prefilled == 128 + sum(len(p) - 128 for p in prompts.values())
    for rid, p in prompts.items():
        tokens, logits = cold_run(model, rid, p)
        assert eng.tokens[rid] == tokens, rid
        assert rel(eng.first_logits[rid], logits) < TOL, rid
    eng.check_drained()
