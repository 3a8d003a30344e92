"""Generation.take: every delta that what is queued allows, in arrival order, a failure after them."""

from __future__ import annotations

import asyncio

import pytest

from ignis.gateway.choice import ChoiceState
from ignis.gateway.generation import Generation
from ignis.shared.sampling import SamplingParams
from ignis.shared.wire import Finished, Generate, Usage


class Routes:
    """The engine client's side a Generation uses: routes and aborts, recorded."""

    def __init__(self):
        self.aborts: list[str] = []
        self.reasons: dict[str, str] = {}
        self.kept: dict[str, int | None] = {}
        self.engine_alive = True

    def open(self, messages, inbox) -> None:
        pass

    def abort(self, engine_id: str, keep_route: bool = False, reason: str = "abort",
              kept_tokens: int | None = None) -> None:
        self.aborts.append(engine_id)
        self.reasons[engine_id] = reason
        self.kept[engine_id] = kept_tokens


def generation(tokenizer, n: int = 1, stops: tuple[str, ...] = ()) -> Generation:
    messages = [Generate(id=f"cmpl-t-{i}", prompt_ids=(1, 2, 3), sampling=SamplingParams()) for i in range(n)]
    return Generation(Routes(), messages, [ChoiceState(i, tokenizer, stops=stops) for i in range(n)])


def put_text(gen: Generation, engine_id: str, tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    for t in ids:
        gen.inbox.put_nowait((engine_id, (t,), None))
    return ids


def test_queued_tokens_and_finish_come_out_in_one_take(demo_tokenizer):
    gen = generation(demo_tokenizer)
    ids = put_text(gen, "cmpl-t-0", demo_tokenizer, "Hello, world")
    gen.inbox.put_nowait(("cmpl-t-0", Finished("cmpl-t-0", "stop", Usage(3, len(ids))), None))
    deltas = gen.take()
    assert [d.content for d in deltas] == ["Hello, world", ""]
    assert deltas[0].token_ids == ids and deltas[1].finish_reason == "stop"
    assert gen.done and not gen.pending and gen.take() == []
    assert gen.usage.completion_tokens == len(ids)


def test_choices_of_one_take_keep_arrival_order(demo_tokenizer):
    gen = generation(demo_tokenizer, n=2)
    put_text(gen, "cmpl-t-1", demo_tokenizer, "b")
    put_text(gen, "cmpl-t-0", demo_tokenizer, "a")
    put_text(gen, "cmpl-t-1", demo_tokenizer, "c")
    assert [(d.index, d.content) for d in gen.take()] == [(1, "b"), (0, "a"), (1, "c")]
    assert not gen.done and not gen.pending


def test_a_failure_behind_tokens_is_raised_after_their_deltas(demo_tokenizer):
    from ignis.gateway.generation import EngineFailed

    gen = generation(demo_tokenizer)
    put_text(gen, "cmpl-t-0", demo_tokenizer, "partial")
    gen.inbox.put_nowait(("cmpl-t-0", Finished("cmpl-t-0", "error", Usage(3, 1), message="boom"), None))
    assert [d.content for d in gen.take()] == ["partial"]
    assert gen.pending
    with pytest.raises(EngineFailed, match="boom"):
        gen.take()


def test_a_stop_string_aborts_at_the_engine_and_keeps_the_route(demo_tokenizer):
    gen = generation(demo_tokenizer, stops=("STOP",))
    put_text(gen, "cmpl-t-0", demo_tokenizer, "one STOP two")
    assert "".join(d.content for d in gen.take()) == "one "
    assert gen.client.aborts == ["cmpl-t-0"]
    assert gen.client.reasons == {"cmpl-t-0": "stop"}  # the engine counts it as a stop, not an abort
    kept = len(gen.choices[0].token_ids)
    assert gen.client.kept == {"cmpl-t-0": kept} and 0 < kept < len(demo_tokenizer.encode("one STOP two"))
    gen.inbox.put_nowait(("cmpl-t-0", Finished("cmpl-t-0", "stop", Usage(3, 9)), None))
    (last,) = gen.take()
    assert last.finish_reason == "stop" and gen.done and gen.usage.completion_tokens == kept


async def test_wait_wakes_on_the_next_item(demo_tokenizer):
    gen = generation(demo_tokenizer)
    assert gen.take() == [] and not gen.pending
    waiting = gen.wait()  # a future
    assert not waiting.done() and gen.inbox.waiting
    put_text(gen, "cmpl-t-0", demo_tokenizer, "x")
    await asyncio.wait_for(waiting, 5)
    assert not gen.inbox.waiting and [d.content for d in gen.take()] == ["x"]
