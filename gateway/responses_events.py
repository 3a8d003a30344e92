"""The ``response`` object of /v1/responses, in one JSON body or as its stream of events.

Streamed, each event is sent as OpenAI sends it, with a ``sequence_number``
counting from 0::

    event: response.output_text.delta
    data: {"type": "response.output_text.delta", "sequence_number": 7, ...}

in this order: ``response.created`` and ``response.in_progress`` (the response
with ``status: in_progress``, no output), each output item's events
(gateway.responses_output), then ``response.completed``, or
``response.incomplete`` (``max_output_tokens`` reached:
``incomplete_details.reason = "max_output_tokens"``), or ``response.failed``
(``status: failed``, ``error: {code, message}``) when generation fails after
the headers went out. No ``[DONE]`` line. Usage::

    {"input_tokens", "input_tokens_details": {"cached_tokens", "cache_write_tokens": 0 (not measured)},
     "output_tokens",
     "output_tokens_details": {"reasoning_tokens"}, "total_tokens"}

``reasoning_tokens`` counts the tokens written inside the thinking block (``ChoiceState``). ``on_done(response,
assistant_turn)`` runs once a turn ends, failed or cancelled too: the store keeps it; ``assistant_turn`` is
None where there is nothing to continue from (it failed, or was cancelled before it wrote anything).

A background response (``run``: gateway.responses_background) is generated as
one body whose events go to its run instead of a connection: ``response.created``
and ``response.queued`` (``status: queued``) once the prompt is sent, then
``response.in_progress`` and the rest as above; a failure ends it with
``response.failed``, a cancel with the done events of the item it cut
(``OutputItems.cut``) and no terminal event: ``status: cancelled``, the output
so far, ``usage`` of the tokens used (null when cancelled while queued: no
token was made).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import ApiError
from ignis.gateway.event_stream import stream_events
from ignis.gateway.generation import Generation, Usage
from ignis.gateway.generation_request import EndpointResponse
from ignis.gateway.params import CommonParams
from ignis.gateway.responses_background import BackgroundRun
from ignis.gateway.responses_output import OutputItems
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")


def event_bytes(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ResponsesResponse(EndpointResponse):
    """One turn of /v1/responses; ``echo``: the request fields a response object repeats."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, items: OutputItems, echo: dict,
                 on_done: Callable[[dict, dict | None], None], run: BackgroundRun | None = None):
        super().__init__(params, tokenizer, head, head)
        self.items = items
        self.echo = echo
        self.on_done = on_done
        self.created_at = int(time.time())
        self.seq = 0
        self.run = run
        self.gen: Generation | None = None  # once opened
        self.failed_response: dict | None = None  # the failed response, once it failed
        if run is not None:
            run.describe_with(self.response)
            queued = self.response("queued")
            self._record({"type": "response.created", "response": queued})
            self._record({"type": "response.queued", "response": queued})

    def response(self, status: str, usage: Usage | None = None, error: dict | None = None) -> dict:
        out = {"id": self.body_head["id"], "object": "response", "created_at": self.created_at, "status": status,
               "model": self.body_head["model"], "output": self.items.snapshot(), "error": error,
               "incomplete_details": None, **self.echo, "usage": None}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if usage is not None:
            reasoning = usage.reasoning_tokens or 0
            out["usage"] = {"input_tokens": usage.prompt_tokens,
                            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
                            "output_tokens": usage.completion_tokens,
                            "output_tokens_details": {"reasoning_tokens": min(reasoning, usage.completion_tokens)},
                            "total_tokens": usage.prompt_tokens + usage.completion_tokens}
        return out

    def final(self, usage: Usage) -> dict:
        closing = self.items.close()
        status = "incomplete" if self.items.finish_reason == "length" else "completed"
        body = self.response(status, usage)
        body["completed_at"] = int(time.time()) if status == "completed" else None
        self.on_done(body, self.items.assistant_turn())
        if self.run is not None:
            for e in closing:
                self._record(e)
            self._record({"type": f"response.{status}", "response": body})
            self.run.end(body)
        return body

    # ----- a background run ------------------------------------------------------------

    def _record(self, event: dict) -> None:
        self.run.add(self._event(event))

    def opened(self, gen: Generation) -> None:
        super().opened(gen)
        self.gen = gen
        if self.run is not None:
            self.run.status = "in_progress"
            self._record({"type": "response.in_progress", "response": self.response("in_progress")})

    def failed(self, err: ApiError) -> None:
        """The background run failed: its open item closed as a cancel closes it, its last event and its
        final state (stored: GET answers it; it cannot be continued)."""
        for e in self._failure_events(err):
            self._record(e)
        self.run.end(self.failed_response)

    def _failure_events(self, err: ApiError) -> list[dict]:
        """The open item's done events (``OutputItems.cut``: the text so far kept) and ``response.failed``;
        the failed response is stored (no turn to continue from)."""
        events = self.items.cut()
        failed = self.failed_response = self.response("failed", error=_error_of(err))
        self.on_done(failed, None)
        return events + [{"type": "response.failed", "response": failed}]

    def cancelled(self) -> None:
        """The background run was cancelled: it keeps what was generated before (the open item closed by
        ``OutputItems.cut``, its done events recorded) and the tokens used; no terminal event."""
        usage = None
        gen = self.gen
        if gen is not None:
            self._flush(gen)
            usage = Usage(prompt_tokens=gen.usage.prompt_tokens, cached_tokens=gen.usage.cached_tokens,
                          completion_tokens=sum(len(c.token_ids) for c in gen.choices),
                          reasoning_tokens=sum(c.reasoning_tokens for c in gen.choices))
        for e in self.items.cut():
            self._record(e)
        cancelled = self.response("cancelled", usage)
        # stored like a finished one: GET answers it after its run is forgotten, and a response that wrote
        # something can be continued from what it kept (as from one cut by max_output_tokens)
        self.on_done(cancelled, self.items.assistant_turn() if gen is not None else None)
        self.run.end(cancelled)

    def _flush(self, gen: Generation) -> None:
        """What ``gen`` received before the cancel and was not taken yet, and the text its choice held back
        (a partial character, a possible stop string or tag), taken as output."""
        try:
            for d in gen.take():
                self.take(d)
        except Exception:  # a failure queued behind them: what came before is kept
            log.debug("response %s: a failure queued at cancel", self.body_head["id"], exc_info=True)
        try:
            d = gen.choices[0].finish("abort")
            d.finish_reason = None  # the output is cut, not finished: ``cancelled`` closes the open item
            self.take(d)
        except Exception:
            log.warning("response %s: its held-back text was lost at cancel", self.body_head["id"], exc_info=True)

    # ----- one body --------------------------------------------------------------------

    def take(self, d: ChoiceDelta) -> None:
        events = self.items.feed(d)
        if self.run is not None:
            for e in events:
                self._record(e)

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        return {}

    def body(self, choices: list[dict], usage: Usage) -> dict:
        return self.final(usage)

    # ----- events ----------------------------------------------------------------------

    def _event(self, event: dict) -> bytes:
        event["sequence_number"] = self.seq
        self.seq += 1
        return event_bytes(event)

    async def stream(self, http: web.Request, gen: Generation, on_tokens: Callable[[int], None],
                     buffer_limit: int, on_stall: Callable[[], None]) -> web.StreamResponse:
        def opening() -> bytes:
            start = self.response("in_progress")
            return (self._event({"type": "response.created", "response": start})
                    + self._event({"type": "response.in_progress", "response": start}))

        def closing() -> bytes:
            body = self.final(gen.usage)
            kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
            return self._event({"type": kind, "response": body})

        def failure(err: ApiError) -> bytes:
            return b"".join(self._event(e) for e in self._failure_events(err))

        return await stream_events(http, gen, buffer_limit=buffer_limit, on_tokens=on_tokens, on_stall=on_stall,
                                   name=f"response {self.body_head['id']}", opening=opening,
                                   events_of=lambda d: [self._event(e) for e in self.items.feed(d)],
                                   closing=closing, failure=failure)


def _error_of(err: ApiError) -> dict:
    """A failed response's ``error``, its ``code`` one of OpenAI's: a full queue is ``rate_limit_exceeded``,
    a prompt past the context ``context_length_exceeded`` (what Codex reads to compact its history), another
    prompt the engine refuses ``invalid_prompt``, anything else ``server_error``."""
    if err.status == 429:
        code = "rate_limit_exceeded"
    elif err.code == "context_length_exceeded":
        code = err.code
    elif 400 <= err.status < 500:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": err.message}
