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

``reasoning_tokens`` counts the reasoning text's tokens. ``on_done(response,
assistant_turn)`` runs once a turn ends (not when it failed): the store keeps it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.generation import ClientGone, Generation, Usage, api_error_of
from ignis.gateway.generation_request import EndpointResponse
from ignis.gateway.params import CommonParams
from ignis.gateway.responses_output import OutputItems
from ignis.gateway.stream_writer import BoundedWriter, StreamStalled, TokenCount, pump_deltas
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")


def event_bytes(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ResponsesResponse(EndpointResponse):
    """One turn of /v1/responses; ``echo``: the request fields a response object repeats."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, items: OutputItems, echo: dict,
                 on_done: Callable[[dict, dict], None]):
        super().__init__(params, tokenizer, head, head)
        self.items = items
        self.echo = echo
        self.on_done = on_done
        self.created_at = int(time.time())
        self.seq = 0

    def response(self, status: str, usage: Usage | None = None, error: dict | None = None) -> dict:
        out = {"id": self.body_head["id"], "object": "response", "created_at": self.created_at, "status": status,
               "model": self.body_head["model"], "output": [dict(i) for i in self.items.items], "error": error,
               "incomplete_details": None, **self.echo, "usage": None}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if usage is not None:
            reasoning = len(self.tokenizer.encode(self.items.reasoning)) if self.items.reasoning else 0
            out["usage"] = {"input_tokens": usage.prompt_tokens,
                            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
                            "output_tokens": usage.completion_tokens,
                            "output_tokens_details": {"reasoning_tokens": min(reasoning, usage.completion_tokens)},
                            "total_tokens": usage.prompt_tokens + usage.completion_tokens}
        return out

    def final(self, usage: Usage) -> dict:
        self.items.close()
        status = "incomplete" if self.items.finish_reason == "length" else "completed"
        body = self.response(status, usage)
        self.on_done(body, self.items.assistant_turn())
        return body

    # ----- one body --------------------------------------------------------------------

    def take(self, d: ChoiceDelta) -> None:
        self.items.feed(d)

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
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(http)
        writer = BoundedWriter(resp, http.transport, buffer_limit)
        count = TokenCount(on_tokens)
        try:
            start = self.response("in_progress")
            await writer.write(self._event({"type": "response.created", "response": start}) +
                             self._event({"type": "response.in_progress", "response": start}))
            out: list[bytes] = []

            def add(deltas) -> None:
                for d in deltas:
                    count.n += len(d.token_ids)
                    out.extend(self._event(e) for e in self.items.feed(d))
                count.flush_some()

            while not gen.done:  # the events of every delta ready at a wake-up leave in one write
                add(gen.take())
                if out:
                    await writer.write(b"".join(out))
                    out.clear()
                if gen.done or gen.pending:
                    continue
                if writer.writes_now:  # steady state: the inbox's pump takes and writes
                    await pump_deltas(gen, writer, out, add)
                    if out:
                        await writer.write(b"".join(out))
                    break
                await gen.wait()
            body = self.final(gen.usage)
            kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
            await writer.write(self._event({"type": kind, "response": body}))
        except StreamStalled as exc:
            return writer.stalled(exc, f"response {self.body_head['id']}", on_stall)
        except (ClientGone, ConnectionResetError):
            raise
        except Exception as exc:  # after the headers: report in-band, never a trace
            err = api_error_of(exc)
            if err.type == "internal_error":
                log.exception("responses stream failed")
            else:
                log.warning("responses stream failed: %s", err.message)
            code = "rate_limit_exceeded" if err.status == 429 else "server_error"
            failed = self.response("failed", error={"code": code, "message": err.message})
            try:
                await resp.write(self._event({"type": "response.failed", "response": failed}))
            except ConnectionResetError:
                raise ClientGone() from None
        finally:
            count.flush()
        await resp.write_eof()
        return resp
