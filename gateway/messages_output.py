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

message_start's usage has the split the engine reported when it admitted the turn (``Admitted``; a
message_start sent early, before the admission, counts the whole prompt as ``input_tokens``);
message_delta's usage, from the Finished, repeats it with the output. ``ping`` events: every ``PING_S``
while the stream lasts, and a turn with no first answer ``START_AFTER_S`` after its engine request sends its
headers, message_start and a ping then (``EarlyStart``; a refusal before that is still an HTTP status).

A failure after the headers went out is an ``error`` event
(``{"type": "error", "error": {"type", "message"}}``) and the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.event_stream import SSE_HEADERS, stream_events
from ignis.gateway.generation import ClientGone, Generation, Usage, api_error_of
from ignis.gateway.generation_request import EndpointResponse
from ignis.gateway.params import CommonParams
from ignis.gateway.stream_writer import BoundedWriter
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells tool_use ids (``toolu_...``): the same random part."""
    return "toolu_" + call_id.removeprefix("call_")


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
        self._pieces: list[str] = []  # the open block's text (a tool call's: its arguments' JSON)
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    @property
    def text(self) -> str:
        """The open one's text so far."""
        return "".join(self._pieces)

    def _open(self, block: dict) -> list[dict]:
        self.kind, self._pieces = block["type"], []
        self.blocks.append(block)
        start = dict(block, input={}) if block["type"] == "tool_use" else dict(block)
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": start}]

    def _delta(self, text: str) -> dict:
        self._pieces.append(text)  # joined once, at the close (no copy of the whole per delta)
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
        self.kind, self._pieces = None, []
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def _switch(self, block: dict) -> list[dict]:
        return self.close() + self._open(block)

    def feed(self, d: ChoiceDelta) -> list[dict]:
        events: list[dict] = []
        for kind, value in d.in_order():
            if kind == "reasoning":
                if self.kind != "thinking":
                    events += self._switch({"type": "thinking", "thinking": "", "signature": ""})
                events.append(self._delta(value))
            elif kind == "content":
                if self.kind != "text":
                    events += self._switch({"type": "text", "text": ""})
                events.append(self._delta(value))
            elif value.index == 0 or self.parallel_calls:
                if value.id is not None:
                    events += self._switch({"type": "tool_use", "id": tool_use_id(value.id), "name": value.name,
                                            "input": {}})
                if value.arguments:
                    events.append(self._delta(value.arguments))
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

    def opening(self, usage: Usage) -> bytes:
        """message_start: the prompt's usage as known so far (its cache reads once the engine admitted it)."""
        start = self.message(usage, final=False)
        start["usage"]["output_tokens"] = 0
        return event_bytes({"type": "message_start", "message": start})

    async def stream(self, http: web.Request, gen: Generation, on_tokens: Callable[[int], None],
                     buffer_limit: int, on_stall: Callable[[], None]) -> web.StreamResponse:
        early = self.early
        if early is not None:
            await early.settle()  # its headers and message_start, when it sent them, are this stream's

        def closing() -> bytes:
            c = self.content
            delta = {"stop_reason": c.stop_reason or "end_turn", "stop_sequence": c.stop_sequence}
            return (event_bytes({"type": "message_delta", "usage": usage_json(gen.usage), "delta": delta})
                    + event_bytes({"type": "message_stop"}))

        return await stream_events(http, gen, buffer_limit=buffer_limit, on_tokens=on_tokens, on_stall=on_stall,
                                   name=f"message {self.body_head['id']}", opening=lambda: self.opening(gen.usage),
                                   events_of=lambda d: [event_bytes(e) for e in self.content.feed(d)],
                                   closing=closing, failure=lambda err: event_bytes(err.anthropic_body()),
                                   resp=early.resp if early is not None else None, background=_pings)

    early: EarlyStart | None = None


START_AFTER_S = 2.0
"""A streamed turn with no first answer this long after its engine request went out sends its headers,
message_start and a ping (a refusal later than this is an ``error`` event, no longer an HTTP status)."""
PING_S = 5.0
"""Then a ``ping`` event every this many seconds, until the stream ends (idle-timeout proxies and
clients keep the connection)."""
PING = event_bytes({"type": "ping"})


class EarlyStart:
    """The head of a streamed turn whose first answer is slow (a long prefill, a queue): ``arm()`` when the
    engine request goes out; ``START_AFTER_S`` later, unless ``settle()`` came first, the headers,
    message_start and pings go out. ``resp``: the response they went out on (None: nothing was sent)."""

    def __init__(self, http: web.Request):
        self.http = http
        self.opening: Callable[[], bytes] | None = None
        self.resp: web.StreamResponse | None = None
        self._task: asyncio.Task | None = None

    def arm(self, opening: Callable[[], bytes]) -> None:
        """``opening``: the message_start to send then (read at that moment: what usage is known by then)."""
        if self._task is None:
            self.opening = opening
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        await asyncio.sleep(START_AFTER_S)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        self.resp = resp
        await resp.prepare(self.http)
        await resp.write(self.opening() + PING)
        while True:
            await asyncio.sleep(PING_S)
            await resp.write(PING)

    async def settle(self) -> None:
        """Stop sending; what went out stays out."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError, ClientGone):
            await task

    async def fail(self, exc: BaseException) -> web.StreamResponse:
        """A failure (an engine refusal) after the headers went out: an ``error`` event, and the body ends."""
        await self.settle()
        err = api_error_of(exc)
        log.warning("message stream failed before its first token: %s", err.message)
        try:
            await self.resp.write(event_bytes(err.anthropic_body()))
            await self.resp.write_eof()
        except ConnectionResetError:
            raise ClientGone() from None
        return self.resp


async def _pings(writer: BoundedWriter) -> None:
    """A ``ping`` every ``PING_S`` (each a whole event, written at once: it never splits another)."""
    while True:
        await asyncio.sleep(PING_S)
        if writer.writes_now:
            writer.write_now(PING)
        else:
            await writer.write(PING)


def usage_json(usage: Usage) -> dict:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {"input_tokens": usage.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": usage.completion_tokens}
