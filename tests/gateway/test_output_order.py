"""Text, reasoning and tool calls keep the order the model wrote them in, however many tokens a delta carries.

One engine round may carry several tokens (a speculative round), so one
delta can hold a call's last arguments, the text after it and the next call.
Anthropic content blocks and Responses output items are built from the
delta's pieces in order: the same blocks whether the text came a character
at a time or in pieces of any size.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.choice import ChoiceDelta, ChoiceState
from ignis.gateway.messages_output import ContentBlocks
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.responses_output import OutputItems
from ignis.gateway.responses_tools import ToolNames

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}} for n in ("get_weather", "get_time")]
CALL = {
    "qwen3_xml": lambda name, args: "<tool_call>\n<function=%s>\n%s</function>\n</tool_call>" % (name, "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())),
    "hermes": lambda name, args: "<tool_call>\n%s\n</tool_call>" % json.dumps({"name": name, "arguments": args}),
}
WANT = [("text", "Checking."), ("call", "get_weather", {"city": "Paris", "days": 2}),
        ("text", "And now the time:"), ("call", "get_time", {}), ("text", "Done.")]


def _text(fmt: str) -> str:
    return ("Checking.\n" + CALL[fmt]("get_weather", {"city": "Paris", "days": 2}) + "\nAnd now the time:\n"
            + CALL[fmt]("get_time", {}) + "\nDone.")


def _deltas(fmt: str, size: int) -> list[ChoiceDelta]:
    parser, text = OutputParser(tool_format=fmt, tools=TOOLS), _text(fmt)
    deltas = []
    for i in range(0, len(text), size):
        deltas.append(ChoiceDelta(0))
        ChoiceState._apply(parser.push(text[i: i + size]), deltas[-1])
    deltas.append(ChoiceDelta(0, finish_reason="stop"))
    ChoiceState._apply(parser.finish(), deltas[-1])
    return deltas


def _blocks(blocks: list[dict]) -> list[tuple]:
    return [("text", b["text"].strip()) if b["type"] == "text" else ("call", b["name"], b["input"])
            for b in blocks if b["type"] != "text" or b["text"].strip()]


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
@pytest.mark.parametrize("size", [1, 3, 4, 7, 40, 10_000])
def test_content_blocks_follow_the_models_order_whatever_the_deltas_size(fmt, size):
    blocks = ContentBlocks()
    for d in _deltas(fmt, size):
        blocks.feed(d)
    assert _blocks(blocks.blocks) == WANT


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
@pytest.mark.parametrize("size", [1, 3, 4, 7, 40, 10_000])
def test_output_items_follow_the_models_order_and_each_call_keeps_its_arguments(fmt, size):
    items = OutputItems(ToolNames())
    for d in _deltas(fmt, size):
        items.feed(d)
    got = [("text", i["content"][0]["text"].strip()) if i["type"] == "message" else
           ("call", i["name"], json.loads(i["arguments"])) for i in items.items
           if i["type"] != "message" or i["content"][0]["text"].strip()]
    assert got == WANT
    # the turn a stored response gives back (previous_response_id): each call with its own arguments
    turn = items.assistant_turn()
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn["tool_calls"]] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
