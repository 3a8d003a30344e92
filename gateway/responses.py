"""Response plumbing shared by both completion endpoints: SSE, logprobs, the stream loop.

SSE framing: each event is ``data: <json>\\n\\n``; the stream ends with
``data: [DONE]\\n\\n``. A failure after the headers went out is sent as an
error event (an OpenAI error object) followed by ``[DONE]``.

Logprobs formats:
    chat        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
    completion  {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
                (each top_logprobs entry names the chosen token too: up to logprobs + 1 entries)

A token is named by its text, or with vLLM's ``return_tokens_as_token_ids`` as
"token_id:<id>" (``token_name``). Chat's ``bytes`` then stay as vLLM writes
them: the chosen token's own bytes, an alternative's the bytes of its name.
``text_offset`` always counts the text's characters.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta, TokenRecord
from ignis.gateway.generation import ClientGone, Generation, api_error_of
from ignis.gateway.stream_writer import (
    DEFAULT_STREAM_BUFFER_BYTES,
    BoundedWriter,
    SseResponse,
    StreamStalled,
    TokenCount,
    pump_deltas,
)
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_skeleton(head: dict, key: str, after: dict) -> tuple[bytes, bytes]:
    """The bytes of ``sse(dict(head, **{key: VALUE}, **after))`` before and after VALUE's JSON: an event that
    differs from chunk to chunk in that one value is ``open + value_json + close``, nothing else serialised
    per chunk."""
    value = "\x00value\x00"  # a string no head holds
    marker = orjson.dumps(value)
    whole = orjson.dumps(dict(head, **{key: value}, **after))
    at = whole.index(marker)
    return b"data: " + whole[:at], whole[at + len(marker):] + b"\n\n"


def json_response(obj: dict, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


def json_logprob(value: float) -> float:
    """A logprob as the API writes it: a probability of zero (-inf) is -9999.0."""
    return -9999.0 if value == -math.inf else value


def token_name(tok: TextTokenizer, token_id: int, as_ids: bool) -> str:
    """How logprobs name a token: its text, or "token_id:<id>" (``as_ids``: vLLM's ``return_tokens_as_token_ids``)."""
    return f"token_id:{token_id}" if as_ids else tok.token_text(token_id)


def chat_logprobs(tok: TextTokenizer, records: list[TokenRecord], as_ids: bool = False) -> list[dict]:
    out = []
    for r in records:
        top = []
        for i, v in r.top:
            name = token_name(tok, i, as_ids)
            top.append({"token": name, "logprob": json_logprob(v),
                        "bytes": list(name.encode() if as_ids else tok.token_bytes(i))})
        out.append({
            "token": token_name(tok, r.token_id, as_ids), "logprob": json_logprob(r.logprob),
            "bytes": list(tok.token_bytes(r.token_id)), "top_logprobs": top,
        })
    return out


class CompletionLogprobs:
    """Accumulates the legacy completions logprobs object of one choice; ``as_ids``: tokens are named by id."""

    def __init__(self, text_offset: int = 0, as_ids: bool = False):
        self.offset = text_offset
        self.as_ids = as_ids

    def add(self, tok: TextTokenizer, records: list[TokenRecord]) -> dict:
        tokens, lps, tops, offsets = [], [], [], []
        as_ids = self.as_ids
        for r in records:
            text = tok.token_text(r.token_id)
            tokens.append(token_name(tok, r.token_id, as_ids))
            lps.append(json_logprob(r.logprob))
            top = {}
            for i, v in r.top:
                top.setdefault(token_name(tok, i, as_ids), json_logprob(v))
            # the legacy API always names the chosen token too (up to logprobs + 1 entries), as vLLM does
            top.setdefault(tokens[-1], lps[-1])
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def merge_completion_logprobs(parts: list[dict]) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for k in out:
            out[k].extend(p[k])
    return out


async def stream_sse(request: web.Request, gen: Generation, prelude: list[bytes],
                     chunk_of: Callable[[ChoiceDelta], bytes | None], usage_chunk: Callable[[dict], bytes] | None,
                     on_tokens: Callable[[int], None] = lambda n: None, *,
                     buffer_limit: int = DEFAULT_STREAM_BUFFER_BYTES,
                     on_stall: Callable[[], None] = lambda: None) -> web.StreamResponse:
    """Send ``prelude``, an SSE event per delta (``chunk_of``: its bytes, or None), the usage event (if
    asked) and [DONE].

    Writes are coalesced: the events of every delta ready at a wake-up leave in one write (the headers
    with the first, the usage event, [DONE] and the end of the body with the last). Once the headers are
    out, the deltas are written by a pump the request's inbox calls in the turn of the loop after the
    engine reader's (``gateway.stream_writer.pump_deltas``): no wake-up of this handler per token.
    ``on_tokens`` (a metrics counter) is told in batches (``TokenCount``), not per delta: a counter
    takes a lock. A client that leaves more than ``buffer_limit`` bytes unread ends the request
    (``gateway.stream_writer``; ``on_stall`` counts it)."""
    resp = SseResponse()
    await resp.prepare(request)
    writer = BoundedWriter(resp, request.transport, buffer_limit)
    count = TokenCount(on_tokens)
    events = list(prelude)
    headers_sent = False
    try:
        while True:
            _add_events(gen.take(), chunk_of, events, count)
            if gen.done:
                break
            if events or not headers_sent:  # the first write carries the headers, event or not
                headers_sent = True
                await writer.write(events[0] if len(events) == 1 else b"".join(events))
                events.clear()
            if gen.pending:
                continue
            if writer.writes_now:
                await pump_deltas(gen, writer, events, lambda deltas: _add_events(deltas, chunk_of, events, count))
                break
            await gen.wait()
        if usage_chunk is not None:
            events.append(usage_chunk(gen.usage.to_json()))
        events.append(DONE)
        await writer.write_eof(b"".join(events))
        return resp
    except StreamStalled as exc:
        return writer.stalled(exc, f"stream of {gen.messages[0].id.rsplit('-', 1)[0]}", on_stall)
    except (ClientGone, ConnectionResetError):
        raise
    except Exception as exc:  # after the headers: report in-band, never a trace
        err = api_error_of(exc)
        if err.type == "internal_error":
            log.exception("stream failed")
        else:
            log.warning("stream failed: %s", err.message)
        events.append(sse(err.body()))
        events.append(DONE)
        try:
            await resp.write_eof(b"".join(events))
        except ConnectionResetError:
            raise ClientGone() from None
        return resp
    finally:
        count.flush()


def _add_events(deltas: list[ChoiceDelta], chunk_of: Callable[[ChoiceDelta], bytes | None], events: list[bytes],
                count: TokenCount) -> None:
    for delta in deltas:
        count.n += len(delta.token_ids)
        event = chunk_of(delta)
        if event is not None:
            events.append(event)
    count.flush_some()
