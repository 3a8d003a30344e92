"""A streamed answer made of named SSE events (/v1/responses, /v1/messages): the loop both share.

``stream_events`` sends ``opening``, then the events of every delta (those
ready at one wake-up in one write; in steady state the inbox's pump takes and
writes them, ``stream_writer.pump_deltas``), then ``closing()`` once every
choice finished. A client that stops reading is dropped as a stall; a failure
after the headers went out is reported in-band (``failure(error)``, never a
trace) and the body ends. ``resp``: a response whose head (and opening) went
out already, to go on with; ``background(writer)``: a task run beside the
loop until the stream ends (the Messages API's pings).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import ApiError
from ignis.gateway.generation import ClientGone, Generation, api_error_of
from ignis.gateway.stream_writer import BoundedWriter, StreamStalled, TokenCount, pump_deltas

log = logging.getLogger("ignis.gateway")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def stream_events(http: web.Request, gen: Generation, *, buffer_limit: int, on_tokens: Callable[[int], None],
                        on_stall: Callable[[], None], name: str, opening: Callable[[], bytes],
                        events_of: Callable[[ChoiceDelta], Iterable[bytes]], closing: Callable[[], bytes],
                        failure: Callable[[ApiError], bytes], resp: web.StreamResponse | None = None,
                        background: Callable[[BoundedWriter], Awaitable[None]] | None = None) -> web.StreamResponse:
    """``name``: what the log calls this answer (``response resp_...``)."""
    started = resp is not None
    if resp is None:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(http)
    writer = BoundedWriter(resp, http.transport, buffer_limit)
    count = TokenCount(on_tokens)
    beside: asyncio.Task | None = None
    try:
        if not started:
            await writer.write(opening())
        if background is not None:
            beside = asyncio.get_running_loop().create_task(background(writer))
            beside.add_done_callback(_quiet)
        out: list[bytes] = []

        def add(deltas) -> None:
            for d in deltas:
                count.n += len(d.token_ids)
                out.extend(events_of(d))
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
        if beside is not None:
            beside.cancel()
        await writer.write(closing())
    except StreamStalled as exc:
        return writer.stalled(exc, name, on_stall)
    except (ClientGone, ConnectionResetError):
        raise
    except Exception as exc:  # after the headers: report in-band, never a trace
        if beside is not None:
            beside.cancel()
        err = api_error_of(exc)
        if err.type == "internal_error":
            log.exception("%s: stream failed", name)
        else:
            log.warning("%s: stream failed: %s", name, err.message)
        try:
            await resp.write(failure(err))
        except ConnectionResetError:
            raise ClientGone() from None
    finally:
        if beside is not None:
            beside.cancel()
        count.flush()
    await resp.write_eof()
    return resp


def _quiet(task: asyncio.Task) -> None:
    """A background task that stopped on a stalled or gone client: the stream's own writes meet that too."""
    if not task.cancelled():
        task.exception()
