"""Reasoning and tool calls from Qwen's real tokenizers, fed token by token as the engine streams them.

In both vocabularies ``<think>``, ``</think>``, ``<tool_call>`` and
``</tool_call>`` are single special tokens, so markers arrive whole while the
XML tags and JSON around them arrive split across many tokens.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.choice import ChoiceState
from ignis.gateway.output_parser import ForcedCall, OutputParser
from ignis.gateway.tokenizer import load_model_files
from ignis.gateway.tool_call_format import forced_call_suffix
from ignis.shared.wire import StreamTokens
from tests.gateway.parser_helpers import gather

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}}]

CALLS = {
    "qwen3_xml": ("<tool_call>\n<function=get_weather>\n<parameter=city>\n東京 Köln\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n"
                  "</function>\n</tool_call>"),
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京 Köln", "days": 3, '
               '"opts": {"unit": "C"}}}\n</tool_call>'),
}
ARGS = {"city": "東京 Köln", "days": 3, "opts": {"unit": "C"}}
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def tokenizer(request, real_tokenizer_dir):
    return load_model_files(real_tokenizer_dir(request.param)).tokenizer


def run(tok, ids, parser):
    """Feed one token per engine round; the gathered output and the finish reason."""
    state = ChoiceState(0, tok, parser=parser)
    events = []
    for t in ids:
        d = state.feed(StreamTokens("r", (t,)))
        events += delta_events(d)
    last = state.finish("stop")
    events += delta_events(last)
    return gather(events), last.finish_reason


def delta_events(d):
    out = [("reasoning", d.reasoning), ("content", d.content)]
    return out + [("tool_call", c) for c in d.tool_calls]


def test_markers_are_single_tokens(tokenizer):
    for marker in MARKERS:
        assert tokenizer.token_id(marker) is not None and len(tokenizer.encode(marker)) == 1, marker


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
def test_reasoning_content_and_two_calls_token_by_token(tokenizer, fmt):
    text = "<think>\nTwo cities.\n</think>\n\nLooking it up.\n" + CALLS[fmt] + "\n" + CALLS[fmt]
    ids = tokenizer.encode(text) + [tokenizer.token_id("<|im_end|>")]
    for marker in MARKERS:
        assert tokenizer.token_id(marker) in ids
    out, reason = run(tokenizer, ids, OutputParser(tool_format=fmt, tools=TOOLS))
    assert out["reasoning"] == "Two cities.\n" and out["content"] == "Looking it up.\n"
    assert [c["name"] for c in out["calls"]] == ["get_weather", "get_weather"]
    assert [json.loads(c["arguments"]) for c in out["calls"]] == [ARGS, ARGS]
    assert reason == "tool_calls"


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
def test_prompt_opened_think_then_content(tokenizer, fmt):
    ids = tokenizer.encode("Plan it.\n</think>\n\nThe answer.")
    out, reason = run(tokenizer, ids, OutputParser(tool_format=fmt, tools=TOOLS, starts_in_reasoning=True))
    assert (out["reasoning"], out["content"], out["calls"], reason) == ("Plan it.\n", "The answer.", [], "stop")


def test_forced_xml_call_token_by_token(tokenizer):
    body = "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    out, reason = run(tokenizer, tokenizer.encode(body),
                      OutputParser(tool_format="qwen3_xml", tools=TOOLS, forced=ForcedCall("get_weather")))
    assert out["calls"] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}] and reason == "tool_calls"


def test_malformed_call_token_by_token_is_content(tokenizer):
    text = "<tool_call>\n{broken json\n</tool_call>"
    out, reason = run(tokenizer, tokenizer.encode(text), OutputParser(tool_format="hermes", tools=TOOLS))
    assert out["calls"] == [] and out["content"] == text and reason == "stop"


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
def test_forced_opener_tokens_are_how_a_whole_call_starts(tokenizer, fmt):
    """The prompt a forced call ends with is tokenized as the model's own call would begin."""
    opener = tokenizer.encode(forced_call_suffix(fmt, "get_weather", False))
    assert tokenizer.encode(CALLS[fmt])[:len(opener)] == opener
    assert tokenizer.encode(forced_call_suffix(fmt, None, False)) == tokenizer.encode(CALLS[fmt])[:2]
