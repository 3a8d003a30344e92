"""What each output token became: reasoning tokens counted by token, message logprobs of the message's tokens.

A choice parsed for reasoning counts the tokens written inside the thinking
block (not ``<think>`` or ``</think>``), however the engine batches them,
with or without logprobs; each token record says what its text became, so a
Responses message reports the logprobs of its own tokens only.
"""

from __future__ import annotations

import pytest

from ignis.gateway.choice import ChoiceState
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.responses_output import OutputItems
from ignis.gateway.responses_tools import ToolNames
from ignis.shared.wire import StreamTokens, TokenLogprobs

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _lp(ids) -> TokenLogprobs:
    return TokenLogprobs(tuple(-0.5 for _ in ids), tuple(() for _ in ids), tuple(() for _ in ids))


def _run(tok, ids, size: int, logprobs: bool, **parser):
    state = ChoiceState(0, tok, parser=OutputParser(**parser))
    deltas = []
    for i in range(0, len(ids), size):
        batch = tuple(ids[i: i + size])
        deltas.append(state.feed(StreamTokens("r", batch, _lp(batch) if logprobs else None)))
    deltas.append(state.finish("stop"))
    return state, deltas


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text) + [tok.token_id("<|im_end|>")]


@pytest.mark.parametrize("size", [1, 2, 5, 100])
@pytest.mark.parametrize("logprobs", [False, True])
def test_reasoning_tokens_are_those_inside_the_block_however_batched(demo_tokenizer, size, logprobs):
    tok = demo_tokenizer
    thought = "weigh it\nthen answer."
    ids = _ids(tok, f"{thought}\n</think>\n\nYes.")
    state, deltas = _run(tok, ids, size, logprobs, starts_in_reasoning=True)
    assert state.reasoning_tokens == len(tok.encode(thought + "\n")) == sum(d.reasoning_tokens for d in deltas)
    assert "".join(d.reasoning for d in deltas) == thought + "\n"
    # the model writes <think> again after a prompt that opened it: dropped, not reasoning text
    state, deltas = _run(tok, _ids(tok, f"<think>\n{thought}</think>Yes."), size, logprobs, starts_in_reasoning=True)
    assert "".join(d.reasoning for d in deltas) == thought and "".join(d.content for d in deltas) == "Yes."
    # a block of newlines alone, cut by max_tokens: no reasoning text, but reasoning tokens
    state, _ = _run(tok, tok.encode("\n\n\n"), size, logprobs, starts_in_reasoning=True)
    assert state.reasoning_tokens == len(tok.encode("\n\n\n")) > 0
    state, _ = _run(tok, _ids(tok, "Plain answer."), size, logprobs)
    assert state.reasoning_tokens == 0


@pytest.mark.parametrize("size", [1, 3, 100])
def test_a_responses_message_reports_the_logprobs_of_its_own_tokens(demo_tokenizer, size):
    tok = demo_tokenizer
    ids = _ids(tok, "Think.\n</think>\n\nAnswer here.")
    _, deltas = _run(tok, ids, size, True, starts_in_reasoning=True)
    items = OutputItems(ToolNames(), logprobs_of=lambda records: [r.token_id for r in records])
    events = [e for d in deltas for e in items.feed(d)]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["text"] == "Answer here." and done["logprobs"] == tok.encode("Answer here.")
    assert [t for e in events if e["type"] == "response.output_text.delta" for t in e["logprobs"]] == \
        done["logprobs"]


@pytest.mark.parametrize("size", [1, 4, 100])
def test_a_message_before_a_call_reports_none_of_the_calls_tokens(demo_tokenizer, size):
    tok = demo_tokenizer
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = _ids(tok, "Checking." + call)
    _, deltas = _run(tok, ids, size, True, tool_format="hermes", tools=TOOLS)
    items = OutputItems(ToolNames(), logprobs_of=lambda records: [r.token_id for r in records])
    events = [e for d in deltas for e in items.feed(d)]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["text"] == "Checking." and done["logprobs"] == tok.encode("Checking.")


@pytest.mark.parametrize("size", [1, 7, 100])
def test_messages_around_a_call_in_one_delta_each_report_their_own_tokens(demo_tokenizer, size):
    tok = demo_tokenizer
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = _ids(tok, "Checking." + call + "Done now.")
    _, deltas = _run(tok, ids, size, True, tool_format="hermes", tools=TOOLS)
    items = OutputItems(ToolNames(), logprobs_of=lambda records: [r.token_id for r in records])
    events = [e for d in deltas for e in items.feed(d)]
    done = [(e["text"], e["logprobs"]) for e in events if e["type"] == "response.output_text.done"]
    assert [text for text, _ in done] == ["Checking.", "Done now."]
    assert done[0][1] == tok.encode("Checking.") and tok.decode(done[1][1]).strip() == "Done now."


CALLS = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>',
         "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\n%s\n</parameter>\n</function>\n"
                      "</tool_call>"}


def _capped(tok, ids, fmt: str, size: int) -> ChoiceState:
    state = ChoiceState(0, tok, parser=OutputParser(tool_format=fmt, tools=TOOLS, max_calls=1))
    content = _feed_all(state, ids, size, "abort")
    assert content == "Sure." and state.parser.num_tool_calls == 2
    return state


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_xml"])
def test_parallel_tool_calls_false_ends_where_the_next_call_is_known_however_the_rounds_are_cut(
        demo_tokenizer, fmt):
    """The choice's tokens end at the token that made the second call known (its name for XML, its block's
    end for hermes), in rounds of one token or many; nothing after it is output."""
    tok = demo_tokenizer
    ids = _ids(tok, "Sure." + CALLS[fmt] % "Paris" + CALLS[fmt] % "Rome" + "LEAKED")
    want = _capped(tok, ids, fmt, 1).token_ids
    assert len(want) < len(ids) - 2
    for size in (2, 4, 7, 100):
        assert _capped(tok, ids, fmt, size).token_ids == want, size


@pytest.mark.parametrize("size", [1, 3, 100])
@pytest.mark.parametrize("logprobs", [False, True])
def test_a_stop_string_a_shown_special_token_completes_ends_at_that_token(demo_tokenizer, size, logprobs):
    """With skip_special_tokens false a special token's text is held until the next token comes (it may be
    the stop token, whose text is left out): a stop string it completes ends the choice at it, not at the
    token after it (usage and token_ids count up to the token that completed the match)."""
    tok = demo_tokenizer
    end = tok.token_id("<|im_end|>")
    ids = tok.encode("Bye.") + [end] + tok.encode(" More text")
    for stop in ("<|im_end|>", "im_end"):
        state = ChoiceState(0, tok, stops=(stop,), skip_special_tokens=False)
        text, records = "", 0
        for i in range(0, len(ids), size):
            if state.stopped_early:
                break
            batch = tuple(ids[i: i + size])
            d = state.feed(StreamTokens("r", batch, _lp(batch) if logprobs else None))
            text, records = text + d.content, records + len(d.logprobs)
        text += state.finish("abort").content
        assert state.token_ids == tok.encode("Bye.") + [end], stop
        assert text == ("Bye." if stop == "<|im_end|>" else "Bye.<|") and records == (len(tok.encode("Bye.")) + 1 if logprobs else 0)


@pytest.mark.parametrize("size", [1, 2, 100])
def test_a_stop_a_shown_special_token_completes_after_a_split_character_ends_at_that_token(demo_tokenizer, size):
    """An incomplete UTF-8 character before the held special token comes out with it (as U+FFFD): the
    special token still completes the stop, and is the last token counted."""
    tok = demo_tokenizer
    lead = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xe0")  # a lone lead byte
    end = tok.token_id("<|im_end|>")
    ids = tok.encode("Hi") + [lead, end, end] + tok.encode(" more")
    state = ChoiceState(0, tok, stops=("<|im_end|>",), skip_special_tokens=False)
    text = _feed_all(state, ids, size)
    assert state.token_ids == tok.encode("Hi") + [lead, end] and text == "Hi\ufffd"


def _feed_all(state, ids, size: int = 1, finish: str = "stop") -> str:
    """``ids`` fed in rounds of ``size`` until the choice stops early, then finished with ``finish``: the text."""
    text = ""
    for i in range(0, len(ids), size):
        if state.stopped_early:
            break
        text += state.feed(StreamTokens("r", tuple(ids[i: i + size]))).content
    return text + state.finish(finish).content


def test_include_stop_str_in_output_shows_the_stop_tokens_text(demo_tokenizer):
    """vLLM leaves a stop token's text out unless include_stop_str_in_output (then it is shown, as the
    detokenizer shows any token, skip_special_tokens still applying)."""
    tok = demo_tokenizer
    two, end = tok.encode(" two")[0], tok.token_id("<|im_end|>")
    ids = tok.encode("one") + [two]
    for include, want in ((False, "one"), (True, "one two")):
        state = ChoiceState(0, tok, stop_token_ids=(two,), include_stop=include)
        assert _feed_all(state, ids) == want
    for include, want in ((False, "one"), (True, "one<|im_end|>")):
        state = ChoiceState(0, tok, include_stop=include, skip_special_tokens=False)
        assert _feed_all(state, tok.encode("one") + [end]) == want


def test_with_ignore_eos_a_shown_special_token_is_matched_and_counted_at_once(demo_tokenizer):
    """ignore_eos: no special token is the one the output stops on, so none is held: a stop string it
    completes ends the choice at it, and min_tokens counts it as it comes."""
    tok = demo_tokenizer
    end = tok.token_id("<|im_end|>")
    state = ChoiceState(0, tok, stops=("<|im_end|>",), skip_special_tokens=False, ignore_eos=True)
    assert _feed_all(state, [end, end, end]) == "" and state.token_ids == [end]
    state = ChoiceState(0, tok, stops=("<|im_end|>",), skip_special_tokens=False, ignore_eos=True, min_tokens=1)
    assert _feed_all(state, [end, end, end]) == "<|im_end|>" and state.token_ids == [end, end]
