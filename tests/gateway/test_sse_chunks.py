"""Streamed chunks spliced from prebuilt bytes are byte for byte what serialising the whole chunk dict gives."""

from __future__ import annotations

import orjson
import pytest

from ignis.gateway.chat import ChatResponse
from ignis.gateway.choice import ChoiceDelta, TokenRecord
from ignis.gateway.completions import CompletionResponse
from ignis.gateway.fields import Fields
from ignis.gateway.params import parse_common
from ignis.gateway.responses import sse, sse_skeleton
from ignis.gateway.tool_call_split import ToolCallDelta

HEAD = {"id": "cmpl-ab\"c\\", "object": "text_completion", "created": 1700000000, "model": "m\u00e9/\u65e5"}
TEXTS = ("", "hello", " world\n", "quote \" backslash \\ tab \t", "\u00e9\u65e5\U0001f600", "\x00\x1f</script>")


def params(kind: str, **body):
    return parse_common(Fields({"model": "m", "stream": True, "n": 4, **body}), {}, kind)


def deltas() -> list[ChoiceDelta]:
    out = []
    for index in (0, 3):
        for text in TEXTS:
            for reason in (None, "stop", "length", "tool_calls"):
                out.append(ChoiceDelta(index, content=text, token_ids=[1, 2], finish_reason=reason))
                out.append(ChoiceDelta(index, reasoning=text, token_ids=[3], finish_reason=reason))
                out.append(ChoiceDelta(index, content=text, reasoning="think", finish_reason=reason))
        out.append(ChoiceDelta(index, tool_calls=[ToolCallDelta(0, "call_1", "f", "{\"a\":"),
                                                  ToolCallDelta(0, None, None, "1}")]))
        out.append(ChoiceDelta(index, content="x", logprobs=[TokenRecord(5, -0.5, ((5, -0.5), (6, -1.0)))],
                               token_ids=[5]))
    return out


@pytest.mark.parametrize("logprobs", [False, True])
def test_completion_choice_bytes_equal_the_dict(demo_tokenizer, logprobs):
    extra = {"logprobs": 2} if logprobs else {}
    fast = CompletionResponse(params("completion", **extra), demo_tokenizer, HEAD, [""] * 4)
    slow = CompletionResponse(params("completion", **extra), demo_tokenizer, HEAD, [""] * 4)
    for d in deltas():
        if d.reasoning or d.tool_calls:
            continue  # a completion has no parser: its text is all content
        assert fast.chunk_choice_bytes(d) == orjson.dumps(slow.chunk_choice(d)), d


@pytest.mark.parametrize("logprobs", [False, True])
def test_chat_choice_bytes_equal_the_dict(demo_tokenizer, logprobs):
    extra = {"logprobs": True, "top_logprobs": 1} if logprobs else {}
    response = ChatResponse(params("chat", **extra), demo_tokenizer, {"id": "chatcmpl-1", "model": "m"})
    for d in deltas():
        assert response.chunk_choice_bytes(d) == orjson.dumps(response.chunk_choice(d)), d


@pytest.mark.parametrize("after", [{}, {"usage": None}])
def test_skeleton_splices_to_the_whole_event(after):
    open_, close = sse_skeleton(HEAD, "choices", after)
    for value in ([], [{"index": 0, "text": "\u65e5"}], [{"a": None}, {"b": [1, 2]}]):
        assert open_ + orjson.dumps(value) + close == sse(dict(HEAD, choices=value, **after))
