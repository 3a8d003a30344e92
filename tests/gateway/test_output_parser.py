"""Reasoning split and the parser as a whole: whole text, every split point, and crafted token streams."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.choice import ChoiceState
from ignis.gateway.output_parser import OutputParser
from ignis.shared.wire import StreamTokens, TokenLogprobs
from tests.gateway.parser_helpers import every_split


def test_reasoning_then_content():
    r = every_split("<think>\nlet me see\n</think>\n\nThe answer is 4.")
    assert r["reasoning"] == "let me see\n" and r["content"] == "The answer is 4."


def test_reasoning_opened_by_the_prompt():
    r = every_split("hmm\n</think>\n\nok", starts_in_reasoning=True)
    assert r["reasoning"] == "hmm\n" and r["content"] == "ok"


def test_closed_empty_think_block_leaves_clean_content():
    r = every_split("<think>\n\n</think>\n\nHello.")
    assert r["reasoning"] == "" and r["content"] == "Hello."


def test_unclosed_reasoning_is_all_reasoning():
    r = every_split("<think>still thinking")
    assert r["reasoning"] == "still thinking" and r["content"] == ""


def test_think_marker_later_in_the_text_is_content():
    r = every_split("Use <think> tags.")
    assert r["content"] == "Use <think> tags." and r["reasoning"] == ""


def test_without_think_markers_all_is_content():
    r = every_split("<think>x</think>y", reasoning=False)
    assert r["content"] == "<think>x</think>y" and r["reasoning"] == ""


def test_text_resembling_a_marker_is_released():
    r = every_split("<thin and <tool", tool_format="hermes")
    assert r["content"] == "<thin and <tool"


CALLS_IN_REASONING = {
    "hermes": '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    "qwen3_xml": "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_xml"])
@pytest.mark.parametrize("close", ["", "</think>"])
def test_a_call_opened_inside_reasoning_ends_it(fmt, close):
    # Qwen3.5 may open a call without closing its reasoning: the call is parsed, not left in the reasoning;
    # a </think> after it is dropped
    text = "<think>maybe call f\n\n" + CALLS_IN_REASONING[fmt] + close
    r = every_split(text, tool_format=fmt, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}])
    assert r["reasoning"] == "maybe call f\n\n" and r["content"] == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in r["calls"]] == [("f", {"x": 1})]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_xml"])
def test_reasoning_that_names_the_call_tag_stays_reasoning(fmt):
    text = "<think>I could write <tool_call> here, or not.</think>done"
    r = every_split(text, tool_format=fmt)
    assert r["reasoning"] == "I could write <tool_call> here, or not." and r["content"] == "done"
    assert r["calls"] == []


def test_a_call_opener_in_reasoning_is_reasoning_when_tools_are_off():
    text = "<think>" + CALLS_IN_REASONING["qwen3_xml"] + "</think>ok"
    r = every_split(text)
    assert r["reasoning"] == CALLS_IN_REASONING["qwen3_xml"] and r["content"] == "ok"


def test_tool_markup_is_content_when_tools_are_off():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert every_split(text)["content"] == text


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
    state, deltas = feed_tokens(demo_tokenizer, ids, parser=OutputParser(tool_format="hermes"))
    pieces = [c for d in deltas for c in d.tool_calls]
    assert pieces[0].name == "get_weather" and pieces[0].id.startswith("call_")
    assert json.loads("".join(c.arguments for c in pieces)) == {"city": "Köln"}
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


def test_choice_include_stop_ends_the_text_with_the_stop_string(demo_tokenizer):
    ids = demo_tokenizer.encode("alpha beta gamma delta epsilon")
    state, deltas = feed_tokens(demo_tokenizer, ids, stops=("mma d",), include_stop=True)
    assert join(deltas, "content") == "alpha beta gamma d"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_sequence == "mma d"
    kept = state.token_ids  # the same tokens as without it: up to the one that completed the stop string
    assert kept == feed_tokens(demo_tokenizer, ids, stops=("mma d",))[0].token_ids and len(kept) < len(ids)


def test_choice_with_min_tokens_looks_for_stop_strings_only_after_them(demo_tokenizer):
    ids = demo_tokenizer.encode("ab ab ab ab")
    assert len(ids) >= 4
    at = [demo_tokenizer.decode(ids[:i + 1]).count("ab") for i in range(len(ids))]
    first_after = next(i for i in range(3, len(ids)) if at[i] > at[2])  # the first "ab" past 3 tokens
    state, deltas = feed_tokens(demo_tokenizer, ids, stops=("ab",), min_tokens=3)
    assert deltas[-1].finish_reason == "stop"
    assert state.token_ids == ids[:first_after + 1]
    assert join(deltas, "content") == demo_tokenizer.decode(ids[:first_after + 1]).rsplit("ab", 1)[0]
    _, plain = feed_tokens(demo_tokenizer, ids, stops=("ab",))
    assert join(plain, "content") == ""


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
    state = ChoiceState(0, demo_tokenizer)
    state.feed(StreamTokens("r", tuple(demo_tokenizer.encode("hi"))))
    assert state.finish(engine_reason).finish_reason == engine_reason


def test_a_call_cut_by_length_keeps_finish_reason_length(demo_tokenizer):
    ids = demo_tokenizer.encode('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    state = ChoiceState(0, demo_tokenizer, parser=OutputParser(tool_format="hermes"))
    state.feed(StreamTokens("r", tuple(ids)))
    assert state.finish("length").finish_reason == "length"
