"""Helpers of the parser tests: run an ``OutputParser`` over pieces of text and gather what it said.

``gather`` joins reasoning and content, and assembles tool calls from their
deltas (checking that each call's first delta names it and the rest only add
argument text); ``every_split`` parses a text fed one character at a time
and split in two at every point, and checks every parse says the same.
"""

from __future__ import annotations

from ignis.gateway.output_parser import OutputParser


def gather(events) -> dict:
    out = {"reasoning": "", "content": "", "calls": []}
    for kind, value in events:
        if kind != "tool_call":
            out[kind] += value
        elif value.id is not None:
            assert value.index == len(out["calls"]) and value.name and value.id.startswith("call_")
            out["calls"].append({"name": value.name, "arguments": value.arguments})
        else:
            assert value.name is None and value.index == len(out["calls"]) - 1
            out["calls"][value.index]["arguments"] += value.arguments
    return out


def parse(pieces, **kwargs) -> dict:
    parser = OutputParser(**kwargs)
    events = []
    for piece in pieces:
        events += parser.push(piece)
    events += parser.finish()
    out = gather(events)
    out["num_tool_calls"] = parser.num_tool_calls
    return out


def every_split(text: str, **kwargs) -> dict:
    """The one parse of ``text`` that every way of feeding it gives."""
    first = parse([text], **kwargs)
    feeds = [list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)]
    for pieces in feeds:
        assert parse(pieces, **kwargs) == first, pieces
    return first
