"""Cheap checks of a raw request body, made before anything is rendered or tokenized.

Every bound follows from the context length C (tokens) the engine reports:

    body bytes      16 * C + 64 KiB   (--max-request-bytes overrides; checked while reading, gateway.body)
    characters      4 * L * C         every string of the body together, keys included, where L is the
                                      vocabulary's longest token in characters (Qwen3.5's: 128, a rule of
                                      dashes) and 4 the most code points Unicode's normalization composes
                                      into one character: a text of more cannot fit in C tokens, so it is
                                      refused before it is rendered or tokenized (a body raised past the
                                      default by --max-request-bytes, e.g. 10 MB, costs no tokenizer time;
                                      an image part's data: URL is not text: the body bytes and
                                      --max-image-bytes bound it)
    messages        C // 4            a chat turn renders to at least 4 tokens
    content parts   C // 4            of all messages together
    tools           min(C // 16, 1024)
    nesting depth   32 levels         each message, each tool's ``parameters`` (34 with the tool around it),
                                      every other field (response_format, chat_template_kwargs, ...), and
                                      the JSON inside each tool call's ``arguments`` string

A body past one is a 400 whose ``param`` names the field and whose message
names the bound. The walk is iterative: no input can exhaust the stack here.

Whether a prompt fits is decided in tokens once it is rendered (as vLLM
decides it); the character bound only refuses what no tokenization could fit.
A tighter guess (a few characters a token) refused prompts that fit (a table
of rules is 80 characters a token) and the over-long prompts that
``truncate_prompt_tokens`` and the Responses API's ``truncation: "auto"`` are
there to cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import accumulate

from ignis.gateway.errors import ApiError, invalid

BYTES_PER_TOKEN = 16
BODY_SLACK_BYTES = 64 << 10
NORMALIZATION_FACTOR = 4
"""The most code points Unicode normalization (NFC, NFKC) composes into one character (Greek ᾅ)."""
DEFAULT_TOKEN_CHARS = 128
"""The longest token assumed when the tokenizer does not say (Qwen3.5's vocabulary's longest)."""
MAX_DEPTH = 32
MAX_TOOLS = 1024
FALLBACK_CONTEXT = 262_144
"""Tokens assumed before the engine has reported its context (the largest of the supported families)."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_PER_ELEMENT = {"messages": 0, "tools": 2}
"""Fields checked element by element, with the levels an element may add around its free-form part
(a tool's object and ``function`` around its ``parameters`` schema)."""


@dataclass(frozen=True)
class RequestLimits:
    """The bounds of one request, from the context length (see the module docstring)."""

    context: int
    body_bytes: int
    chars: int
    messages: int
    content_parts: int
    tools: int
    depth: int = MAX_DEPTH

    @classmethod
    def for_context(cls, context: int | None, max_request_bytes: int | None = None,
                    token_chars: int = DEFAULT_TOKEN_CHARS) -> RequestLimits:
        """``token_chars``: the longest token of the vocabulary, in characters."""
        c = int(context) if context else FALLBACK_CONTEXT
        body = max_request_bytes if max_request_bytes is not None else BYTES_PER_TOKEN * c + BODY_SLACK_BYTES
        return cls(context=c, body_bytes=body, chars=NORMALIZATION_FACTOR * token_chars * c,
                   messages=max(c // 4, 1), content_parts=max(c // 4, 1), tools=max(min(c // 16, MAX_TOOLS), 1))

    @classmethod
    def of(cls, gw) -> RequestLimits:
        """The bounds a gateway (``GatewayState``) holds a request to now: its engine's context, its
        ``--max-request-bytes`` and its tokenizer's longest token."""
        return cls.for_context(gw.client.stats_values.get("max_model_len"), gw.config.max_request_bytes,
                               gw.tokenizer.longest_token_chars)


def _walk(value: object) -> tuple[int, int]:
    """(characters of every string and key, nesting depth) of a parsed JSON value; a scalar has depth 0."""
    chars = 0
    depth = 0
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            chars += len(v)
        elif isinstance(v, dict):
            depth = max(depth, d + 1)
            for k, item in v.items():
                chars += len(k)
                if k == "url" and isinstance(item, str) and item.startswith("data:"):
                    continue  # an image's bytes, not text
                stack.append((item, d + 1))
        elif isinstance(v, list):
            depth = max(depth, d + 1)
            stack.extend((item, d + 1) for item in v)
    return chars, depth


def text_depth(text: str) -> int:
    """The bracket nesting depth of JSON held in a string (what json.loads would recurse through)."""
    brackets = _BRACKETS.findall(_JSON_STRING.sub("", text))
    if not brackets:
        return 0
    return max(accumulate(1 if b in "[{" else -1 for b in brackets))


def _too_deep(param: str, depth: int, limits: RequestLimits) -> ApiError:
    return invalid(f"{param} nests {depth} levels deep, at most {limits.depth} allowed", param,
                   code="nesting_too_deep")


def _element_too_deep(key: str, i: int, item: object, depth: int, limits: RequestLimits) -> ApiError:
    if key == "tools" and isinstance(item, dict) and isinstance(item.get("function"), dict):
        inner = _walk(item["function"].get("parameters"))[1]
        if inner > limits.depth:
            return _too_deep(f"tools[{i}].function.parameters", inner, limits)
    return _too_deep(f"{key}[{i}]", depth, limits)


def _check_counts(body: dict, limits: RequestLimits) -> None:
    messages, tools = body.get("messages"), body.get("tools")
    if isinstance(messages, list) and len(messages) > limits.messages:
        raise invalid(f"messages has {len(messages)} items, at most {limits.messages} allowed for a "
                      f"{limits.context}-token context", "messages", code="too_many_messages")
    if isinstance(tools, list) and len(tools) > limits.tools:
        raise invalid(f"tools has {len(tools)} items, at most {limits.tools} allowed", "tools", code="too_many_tools")
    parts = 0
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            parts += len(content)
            if parts > limits.content_parts:
                raise invalid(f"messages hold more than {limits.content_parts} content parts (images included) "
                              f"in all, the most allowed for a {limits.context}-token context",
                              f"messages[{i}].content", code="too_many_content_parts")
        calls = m.get("tool_calls")
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                depth = text_depth(args)
                if depth > limits.depth:
                    raise _too_deep(f"messages[{i}].tool_calls[{j}].function.arguments", depth, limits)


def check_body(body: dict, limits: RequestLimits) -> None:
    """400 for the first bound ``body`` (a parsed request object) breaks: counts first, then characters
    (one walk over the body), then nesting."""
    _check_counts(body, limits)
    chars = 0
    deep: ApiError | None = None
    for key, value in body.items():
        chars += len(key)
        if key in _PER_ELEMENT and isinstance(value, list):
            for i, item in enumerate(value):
                c, d = _walk(item)
                chars += c
                if deep is None and d > limits.depth + _PER_ELEMENT[key]:
                    deep = _element_too_deep(key, i, item, d, limits)
            continue
        c, d = _walk(value)
        chars += c
        if deep is None and d > limits.depth:
            deep = _too_deep(key, d, limits)
    if chars > limits.chars:
        raise invalid(f"the request holds {chars} characters of text, more than any prompt of the "
                      f"{limits.context}-token context can hold ({limits.chars}: "
                      f"{limits.chars // limits.context} per token at most): it cannot fit",
                      None, code="context_length_exceeded")
    if deep is not None:
        raise deep
