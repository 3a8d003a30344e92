"""The thinking budget's state machine (engine.thinking_budget): what it forces, step by step."""

from __future__ import annotations

import pytest

from ignis.engine.thinking_budget import COUNTING, DONE, FORCING, WAITING, ThinkingBudget
from ignis.shared.sampling import SamplingParams

START, END = 90, 91
END_IDS = (10, END, 11)  # "\n", "</think>", "\n\n"


def budget(n: int, *, opened: bool = True, start: int | None = START) -> ThinkingBudget:
    return ThinkingBudget(SamplingParams(thinking_budget=n, thinking_open=opened, think_start_id=start,
                                         think_end_id=END, thinking_end_ids=END_IDS))


def run(tb: ThinkingBudget, free: list[int], steps: int) -> list[int]:
    """``steps`` tokens: the forced id where there is one, else the next of ``free``."""
    out, free = [], list(free)
    for _ in range(steps):
        token = tb.forced if tb.forced is not None else free.pop(0)
        tb.record(token)
        out.append(token)
    return out


def test_a_spent_budget_forces_exactly_the_end_then_runs_free():
    tb = budget(3)
    assert tb.phase == COUNTING
    out = run(tb, [1, 2, 3, 4, 5, 6], 9)
    assert out == [1, 2, 3, *END_IDS, 4, 5, 6]
    assert tb.phase == DONE and tb.forced is None


def test_the_models_own_end_before_the_budget_forces_nothing():
    tb = budget(4)
    out = run(tb, [1, 2, END, 3, 4, 5, 6, 7], 8)
    assert out == [1, 2, END, 3, 4, 5, 6, 7] and tb.phase == DONE


def test_a_block_the_model_opens_counts_after_its_start_token():
    tb = budget(2, opened=False)
    assert tb.phase == WAITING and tb.forced is None
    out = run(tb, [START, 1, 2, 3], 6)
    assert out == [START, 1, 2, *END_IDS]  # the <think> itself is not counted
    assert run(tb, [4], 1) == [4]


def test_without_a_block_nothing_is_counted_or_forced():
    tb = budget(1, opened=False)
    out = run(tb, [1, START, 2, 3, 4], 5)  # a <think> after the first token opens nothing
    assert out == [1, START, 2, 3, 4] and tb.phase == DONE


def test_a_budget_of_zero_forces_at_once():
    assert run(budget(0), [1, 2], 5) == [*END_IDS, 1, 2]
    model_opened = budget(0, opened=False)
    assert run(model_opened, [START, 1], 5) == [START, *END_IDS, 1]


def test_a_saved_state_resumes_mid_forcing():
    tb = budget(2)
    run(tb, [1, 2], 3)  # 1, 2, then the end's first id
    assert tb.phase == FORCING and tb.forced == END
    saved = tb.state()
    run(tb, [7, 8], 4)
    assert tb.phase == DONE
    tb.set_state(saved)
    assert run(tb, [7, 8], 4) == [END, 11, 7, 8]


@pytest.mark.parametrize("kwargs, match", [
    ({"thinking_budget": 3, "think_end_id": END, "thinking_end_ids": END_IDS}, "thinking_open or think_start_id"),
    ({"thinking_budget": 3, "thinking_open": True, "think_end_id": END, "thinking_end_ids": (10, 11)}, "holding it"),
    ({"thinking_open": True}, "need a thinking_budget"),
])
def test_inconsistent_budget_fields_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
