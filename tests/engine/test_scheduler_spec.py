"""The scheduler's side of speculative decoding: draft room, accepted tokens, pages of rejected drafts."""

from __future__ import annotations

import pytest

from ignis.engine.request import Request
from ignis.engine.schedule import RoundResult
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.shared.sampling import SamplingParams


def started(prompt_len: int, k: int = 3, max_tokens: int = 20, stop=()) -> tuple[Scheduler, Request]:
    sched = Scheduler(SchedulerConfig(decode_lanes=2, num_pages=8, max_model_len=512, speculative_tokens=k),
                      reuse=False)
    req = Request("a", tuple(range(2, 2 + prompt_len)),
                  SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=tuple(stop)))
    assert sched.add(req) is None
    sched.schedule()
    sched.update(RoundResult(tokens={"a": 7}))  # the prompt's round samples the first token
    return sched, req


def test_decode_gets_room_and_pages_for_its_drafts():
    sched, req = started(62)
    (item,) = sched.schedule().decodes
    assert (item.position, item.room) == (62, 3)
    assert len(item.pages) == 2  # positions 62 .. 65 cross into a second page


def test_rejected_drafts_give_their_page_back_and_accepted_ones_count():
    sched, req = started(62)
    sched.schedule()
    sched.update(RoundResult(tokens={"a": 8}, extra={"a": []}))  # every draft rejected
    assert req.num_computed_tokens == 63 and len(req.page_table.pages) == 1
    (item,) = sched.schedule().decodes
    sched.update(RoundResult(tokens={"a": 9}, extra={"a": [10, 11]}))
    assert req.num_computed_tokens == item.position + 3
    assert req.output_ids == [7, 8, 9, 10, 11]


def test_accepted_tokens_stop_at_a_stop_token_and_at_max_tokens():
    sched, req = started(5, stop=(10,))
    sched.schedule()
    result = RoundResult(tokens={"a": 9}, extra={"a": [10, 11, 12]})
    (ev,) = sched.update(result)
    assert ev.reason == "stop" and req.output_ids == [7, 9, 10] and result.extra["a"] == [10]

    sched, req = started(5, max_tokens=3)
    (item,) = sched.schedule().decodes
    assert item.room == 1  # one token left after this step's own
    result = RoundResult(tokens={"a": 9}, extra={"a": [10]})
    (ev,) = sched.update(result)
    assert ev.reason == "length" and req.output_ids == [7, 9, 10]


def test_more_accepted_tokens_than_room_is_refused():
    sched, _ = started(5, k=1)
    sched.schedule()
    with pytest.raises(ValueError, match="2 draft tokens, room for 1"):
        sched.update(RoundResult(tokens={"a": 9}, extra={"a": [10, 11]}))


def test_no_room_without_speculation():
    sched, _ = started(5, k=0)
    assert sched.schedule().decodes[0].room == 0
