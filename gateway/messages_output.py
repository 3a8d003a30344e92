"""An Anthropic Messages turn's content blocks, built from the chat path's deltas, in one body or as events.

    reasoning text  -> {"type": "thinking", "thinking", "signature": ""}
    content text    -> {"type": "text", "text"}
    a tool call     -> {"type": "tool_use", "id", "name", "input": {...}}   (its arguments, parsed)

One block is open at a time; text of another kind closes it. Streamed, each
event goes out as Anthropic sends it (``event: <type>`` then ``data:``)::

    message_start         the message with no content, stop_reason null, usage with input tokens
    content_block_start   {"index", "content_block": the block, empty}
    content_block_delta   {"index", "delta": text_delta | thinking_delta | input_json_delta}
    content_block_stop    {"index"}
    message_delta         {"delta": {"stop_reason", "stop_sequence"}, "usage": the whole usage}
    message_stop

``stop_reason``: ``end_turn``, ``max_tokens``, ``stop_sequence`` (with the
string that matched) or ``tool_use``. Usage::

    {"input_tokens": prompt tokens not read from reuse, "cache_read_input_tokens": those that were,
     "cache_creation_input_tokens": 0, "output_tokens"}

A failure after the headers went out is an ``error`` event
(``{"type": "error", "error": {"type", "message"}}``) and the stream ends.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import ApiError
from ignis.gateway.event_stream import stream_events
from ignis.gateway.generation import Generation, Usage
from ignis.gateway.generation_request import EndpointResponse
from ignis.gateway.params import CommonParams
from ignis.gateway.tokenizer import TextTokenizer

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def event_bytes(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ContentBlocks:
    """The blocks of choice 0 so far; ``feed`` returns each delta's events (without the message's own)."""

    def __init__(self, parallel_calls: bool = True):
        self.parallel_calls = parallel_calls  # false: the first tool call only
        self.blocks: list[dict] = []
        self.kind: str | None = None  # of the open block: thinking | text | tool_use
        self.text = ""  # of the open block (a tool call's: its arguments' JSON)
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    def _open(self, block: dict) -> list[dict]:
        self.kind, self.text = block["type"], ""
        self.blocks.append(block)
        start = dict(block, input={}) if block["type"] == "tool_use" else dict(block)
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": start}]

    def _delta(self, text: str) -> dict:
        self.text += text
        kind = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
                "tool_use": ("input_json_delta", "partial_json")}[self.kind]
        return {"type": "content_block_delta", "index": len(self.blocks) - 1,
                "delta": {"type": kind[0], kind[1]: text}}

    def close(self) -> list[dict]:
        if self.kind is None:
            return []
        block = self.blocks[-1]
        if self.kind == "tool_use":
            block["input"] = _arguments(self.text)
        else:
            block[self.kind] = self.text
        self.kind, self.text = None, ""
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def _switch(self, block: dict) -> list[dict]:
        return self.close() + self._open(block)

    def feed(self, d: ChoiceDelta) -> list[dict]:
        events: list[dict] = []
        if d.reasoning:
            if self.kind != "thinking":
                events += self._switch({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta(d.reasoning))
        if d.content:
            if self.kind != "text":
                events += self._switch({"type": "text", "text": ""})
            events.append(self._delta(d.content))
        for piece in d.tool_calls:
            if piece.index > 0 and not self.parallel_calls:
                continue
            if piece.id is not None:
                events += self._switch({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
            if piece.arguments:
                events.append(self._delta(piece.arguments))
        if d.finish_reason:
            events += self.close()
            self.stop_reason = STOP_REASONS.get(d.finish_reason, "end_turn")
            if d.stop_sequence is not None:
                self.stop_reason, self.stop_sequence = "stop_sequence", d.stop_sequence
        return events


def _arguments(text: str) -> dict:
    """A call's arguments as the object Anthropic's ``input`` is (the parser checked they are JSON)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


class MessagesResponse(EndpointResponse):
    """One turn of /v1/messages (``n`` is 1)."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, parallel_calls: bool = True):
        super().__init__(params, tokenizer, head, head)
        self.content = ContentBlocks(parallel_calls)

    def message(self, usage: Usage | None, final: bool) -> dict:
        c = self.content
        return {"id": self.body_head["id"], "type": "message", "role": "assistant", "model": self.body_head["model"],
                "content": [dict(b) for b in c.blocks] if final else [],
                "stop_reason": c.stop_reason if final else None, "stop_sequence": c.stop_sequence if final else None,
                "usage": usage_json(usage) if usage is not None else None}

    # ----- one body --------------------------------------------------------------------

    def take(self, d: ChoiceDelta) -> None:
        self.content.feed(d)

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        return {}

    def body(self, choices: list[dict], usage: Usage) -> dict:
        self.content.close()
        return self.message(usage, final=True)

    # ----- events ----------------------------------------------------------------------

    async def stream(self, http: web.Request, gen: Generation, on_tokens: Callable[[int], None],
                     buffer_limit: int, on_stall: Callable[[], None]) -> web.StreamResponse:
        def opening() -> bytes:
            start = self.message(gen.usage, final=False)
            start["usage"]["output_tokens"] = 0
            return event_bytes({"type": "message_start", "message": start})

        def closing() -> bytes:
            c = self.content
            delta = {"stop_reason": c.stop_reason or "end_turn", "stop_sequence": c.stop_sequence}
            return (event_bytes({"type": "message_delta", "usage": usage_json(gen.usage), "delta": delta})
                    + event_bytes({"type": "message_stop"}))

        def failure(err: ApiError) -> bytes:
            return event_bytes(err.anthropic_body())

        return await stream_events(http, gen, buffer_limit=buffer_limit, on_tokens=on_tokens, on_stall=on_stall,
                                   name=f"message {self.body_head['id']}", opening=opening,
                                   events_of=lambda d: [event_bytes(e) for e in self.content.feed(d)],
                                   closing=closing, failure=failure)


def usage_json(usage: Usage) -> dict:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {"input_tokens": usage.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": usage.completion_tokens}
