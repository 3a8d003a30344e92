"""A Responses turn's output items: the logprobs an output_text reports, token for token with its text."""

from __future__ import annotations

from ignis.gateway.choice import ChoiceDelta, TokenRecord
from ignis.gateway.responses_output import OutputItems
from ignis.gateway.responses_tools import ToolNames


def _items() -> OutputItems:
    return OutputItems(ToolNames(), logprobs_of=lambda records: [{"id": r.token_id} for r in records])


def _ids(event: dict) -> list[int]:
    return [lp["id"] for lp in event["logprobs"]]


def test_tokens_held_back_by_the_parser_are_reported_with_the_content_they_became():
    """Leading whitespace comes with no text (it could still open a <think> block): its tokens belong to
    the content that follows, not dropped (the text and the logprobs would no longer line up)."""
    items = _items()
    assert items.feed(ChoiceDelta(0, logprobs=[TokenRecord(1, -0.1)])) == []
    events = items.feed(ChoiceDelta(0, content="\n\n VIII", logprobs=[TokenRecord(2, -0.2, kind="content")]))
    events += items.feed(ChoiceDelta(0, content="uet", logprobs=[TokenRecord(3, -0.3, kind="content")],
                                     finish_reason="stop"))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [_ids(e) for e in deltas] == [[1, 2], [3]]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert _ids(done) == [1, 2, 3]


def test_an_answer_of_whitespace_alone_reports_every_token():
    items = _items()
    for i in range(4):
        items.feed(ChoiceDelta(0, logprobs=[TokenRecord(i, -1.0)]))
    events = items.feed(ChoiceDelta(0, content="\n\n" * 4, finish_reason="stop"))
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert _ids(done) == [0, 1, 2, 3] and done["text"] == "\n\n" * 4


def test_held_tokens_that_became_reasoning_are_not_reported_as_content():
    items = _items()
    items.feed(ChoiceDelta(0, logprobs=[TokenRecord(1, -0.1)]))
    items.feed(ChoiceDelta(0, reasoning="thinking", logprobs=[TokenRecord(2, -0.2, kind="reasoning")]))
    events = items.feed(ChoiceDelta(0, content="answer", logprobs=[TokenRecord(3, -0.3, kind="content")],
                                    finish_reason="stop"))
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert _ids(done) == [3]
