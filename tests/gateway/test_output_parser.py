"""Reasoning and tool-call parsing: whole text, every split point, and crafted token streams."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.choice import ChoiceState
from ignis.gateway.output_parser import OutputParser, parse_tool_call
from ignis.shared.wire import StreamTokens, TokenLogprobs


def parse(text, pieces=None, **kwargs):
    p = OutputParser(**kwargs)
    events = []
    for piece in pieces if pieces is not None else [text]:
        events += p.push(piece)
    events += p.finish()
    out = {"reasoning": "", "content": "", "tool_call": []}
    for kind, value in events:
        if kind == "tool_call":
            out[kind].append(value)
        else:
            out[kind] += value
    return out


def every_split(text, **kwargs):
    """The parse of ``text`` fed one character at a time, and split in two at every point."""
    results = [parse(text, list(text), **kwargs)]
    results += [parse(text, [text[:i], text[i:]], **kwargs) for i in range(len(text) + 1)]
    return results


def same(results):
    first = results[0]
    for r in results[1:]:
        assert (r["reasoning"], r["content"]) == (first["reasoning"], first["content"])
        assert [(c.name, c.arguments) for c in r["tool_call"]] == [(c.name, c.arguments) for c in first["tool_call"]]
    return first


def test_reasoning_then_content():
    r = same(every_split("<think>\nlet me see\n</think>\n\nThe answer is 4."))
    assert r["reasoning"] == "let me see\n" and r["content"] == "The answer is 4."


def test_reasoning_opened_by_the_prompt():
    r = same(every_split("hmm\n</think>\n\nok", starts_in_reasoning=True))
    assert r["reasoning"] == "hmm\n" and r["content"] == "ok"


def test_unclosed_reasoning_is_all_reasoning():
    r = same(every_split("<think>still thinking"))
    assert r["reasoning"] == "still thinking" and r["content"] == ""


def test_think_marker_later_in_the_text_is_content():
    r = same(every_split("Use <think> tags."))
    assert r["content"] == "Use <think> tags." and r["reasoning"] == ""


def test_text_resembling_a_marker_is_released():
    r = same(every_split("<thin and <tool", tools=True))
    assert r["content"] == "<thin and <tool"


def test_tool_calls_parsed():
    text = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    r = same(every_split(text, tools=True))
    assert r["content"] == "I will check.\n"
    assert [c.name for c in r["tool_call"]] == ["get_weather", "get_time"]
    assert json.loads(r["tool_call"][0].arguments) == {"city": "Paris"}
    assert all(c.id.startswith("call_") for c in r["tool_call"])


def test_tool_call_after_reasoning():
    text = '<think>need weather</think>\n<tool_call>{"name": "w", "arguments": {"q": 1}}</tool_call>'
    r = same(every_split(text, tools=True))
    assert r["reasoning"] == "need weather" and r["content"] == "" and r["tool_call"][0].name == "w"


def test_malformed_tool_call_stays_content():
    text = "<tool_call>{not json}</tool_call>"
    r = same(every_split(text, tools=True))
    assert r["content"] == text and not r["tool_call"]


def test_unclosed_tool_call_is_parsed_at_the_end_when_it_is_json():
    r = parse('<tool_call>{"name": "f", "arguments": {"a": 1}}', tools=True)
    assert r["tool_call"][0].name == "f"
    r = parse('<tool_call>{"name": "f", "argu', tools=True)
    assert r["content"] == '<tool_call>{"name": "f", "argu' and not r["tool_call"]


def test_tool_markup_is_content_when_tools_are_off():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse(text, tools=False)["content"] == text


def test_parse_tool_call_shapes():
    assert parse_tool_call('{"name": "f", "arguments": "{\\"x\\": 1}"}').arguments == '{"x": 1}'
    assert parse_tool_call('{"name": "f", "parameters": {"x": 1}}').arguments == '{"x": 1}'
    assert parse_tool_call('{"name": "", "arguments": {}}') is None
    assert parse_tool_call('["f"]') is None
    assert parse_tool_call('{"name": "f", "arguments": 3}') is None


def feed_tokens(tok, ids, **kwargs):
    """A ChoiceState fed one token per engine round, as the engine streams."""
    state = ChoiceState(0, tok, **kwargs)
    deltas = [state.feed(StreamTokens("r", (t,))) for t in ids]
    deltas.append(state.finish("stop"))
    return state, deltas


def join(deltas, attr):
    return "".join(getattr(d, attr) for d in deltas)


def test_choice_tool_call_from_a_token_stream(demo_tokenizer):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n</tool_call>'
    ids = demo_tokenizer.encode(text) + [demo_tokenizer.token_id("<|im_end|>")]
    assert demo_tokenizer.token_id("<tool_call>") in ids
    state, deltas = feed_tokens(demo_tokenizer, ids, parser=OutputParser(tools=True))
    calls = [c for d in deltas for c in d.tool_calls]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Köln"}
    assert join(deltas, "content") == ""
    assert deltas[-1].finish_reason == "tool_calls"
    assert state.token_ids == ids


def test_choice_reasoning_from_a_token_stream(demo_tokenizer):
    ids = demo_tokenizer.encode("<think>\nweigh it\n</think>\n\nYes.") + [demo_tokenizer.token_id("<|im_end|>")]
    _, deltas = feed_tokens(demo_tokenizer, ids, parser=OutputParser())
    assert join(deltas, "reasoning") == "weigh it\n" and join(deltas, "content") == "Yes."
    assert deltas[-1].finish_reason == "stop"


def test_choice_stop_string_cuts_tokens_and_text(demo_tokenizer):
    text = "alpha beta gamma delta"
    ids = demo_tokenizer.encode(text)
    state, deltas = feed_tokens(demo_tokenizer, ids, stops=("mma d",))
    assert join(deltas, "content") == "alpha beta ga"
    assert deltas[-1].finish_reason == "stop"
    # Tokens are kept up to the one that completed the stop string, none after it.
    kept = state.token_ids
    assert "mma d" in demo_tokenizer.decode(kept) and "mma d" not in demo_tokenizer.decode(kept[:-1])


def test_choice_user_stop_token_is_kept_but_not_rendered(demo_tokenizer):
    stop_id = demo_tokenizer.token_id("</tool_call>")
    ids = demo_tokenizer.encode("abc") + [stop_id]
    state, deltas = feed_tokens(demo_tokenizer, ids, stop_token_ids=(stop_id,))
    assert join(deltas, "content") == "abc" and state.token_ids == ids


def test_choice_records_logprobs(demo_tokenizer):
    state = ChoiceState(0, demo_tokenizer)
    lp = TokenLogprobs(logprobs=(-0.5,), top_ids=((5, 6),), top_logprobs=((-0.5, -1.5),))
    d = state.feed(StreamTokens("r", (5,), lp))
    assert d.logprobs[0].token_id == 5 and d.logprobs[0].top == ((5, -0.5), (6, -1.5))


@pytest.mark.parametrize("engine_reason", ["length", "stop"])
def test_choice_finish_reasons(demo_tokenizer, engine_reason):
    _, deltas = feed_tokens(demo_tokenizer, demo_tokenizer.encode("hi"))
    state = ChoiceState(0, demo_tokenizer)
    assert state.finish(engine_reason).finish_reason == engine_reason
