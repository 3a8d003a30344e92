"""A streamed response's writes, with a bound on what a client that stops reading can leave buffered.

The gateway never waits for a slow client: a write goes into the connection's
write buffer (the transport's, in user space) and returns, so its stream keeps
taking its engine output and no backlog builds anywhere else. What a client
has not taken stays in that buffer; once it holds more than ``limit`` bytes
(``--stream-buffer-bytes``) the next ``write`` raises ``StreamStalled``
instead (so the buffer holds at most the limit plus one event). The
transport's own high-water mark is set above that, so a write never parks
the handler in aiohttp's drain.

    writer = BoundedWriter(resp, request.transport, limit)
    await writer.write(chunk)       # StreamStalled: the buffer already holds more than the limit
    await writer.write_eof(chunk)   # the same check; the last bytes and the end of the body in one write
    await pump_deltas(gen, writer, events, add)   # steady state: the inbox's pump takes and writes

``SseResponse`` is a streamed response whose headers leave with its first
write (one send, not two; aiohttp sends a plain ``StreamResponse``'s headers
on their own at ``prepare``).

The caller ends the request on ``StreamStalled`` and returns ``stalled()``'s
response: the connection dropped, a log line,
``ignis:gateway_stream_stalled_aborts_total``; the engine streams are aborted
as the handler leaves its ``Generation`` (whose close aborts every unfinished
choice), so their lanes are freed. The kernel's socket buffers (up to a few
MiB) fill before this buffer does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from ignis.gateway.config import GatewayConfig
from ignis.gateway.generation import ClientGone, Generation

log = logging.getLogger("ignis.gateway")

DEFAULT_STREAM_BUFFER_BYTES = GatewayConfig.stream_buffer_bytes
TOKENS_PER_COUNT = 256
"""Streamed tokens a response gathers before it tells its metrics counter (``TokenCount``)."""
STALLED = web.ResponseKey("stalled", bool)
"""Set on a response ended by a stall."""


class StreamStalled(ClientGone):
    """The client stopped reading: its unwritten output passed the stream buffer limit."""

    def __init__(self, buffered: int, limit: int):
        super().__init__(f"{buffered} bytes of output unwritten, past the limit of {limit}")
        self.buffered = buffered
        self.limit = limit


class SseResponse(web.StreamResponse):
    """A ``text/event-stream`` response whose headers are sent with its first write (``write(b"")`` sends
    them alone)."""

    _send_headers_immediately = False  # aiohttp's switch (its one-body Response has it off)

    def __init__(self):
        super().__init__(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                  "X-Accel-Buffering": "no"})


class BoundedWriter:
    """Writes of one streamed response; ``limit`` bytes at most waiting in the connection's write buffer."""

    def __init__(self, resp: web.StreamResponse, transport: asyncio.Transport | None, limit: int):
        self.resp = resp
        self.transport = transport
        self.limit = limit
        if transport is not None:
            transport.set_write_buffer_limits(high=2 * limit + (1 << 16))  # the bound below pauses first

    def _check(self) -> None:
        """StreamStalled when the connection's buffer already holds more than the limit."""
        t = self.transport
        if t is not None:
            buffered = t.get_write_buffer_size()
            if buffered > self.limit:
                raise StreamStalled(buffered, self.limit)

    async def write(self, data: bytes) -> None:
        self._check()
        await self.resp.write(data)

    @property
    def writes_now(self) -> bool:
        """Whether ``write_now`` can write: the headers are out and the response's writer has the plain
        (uncompressed) write calls of this aiohttp."""
        pw = getattr(self.resp, "_payload_writer", None)
        return (pw is not None and not getattr(pw, "_headers_buf", None) and getattr(pw, "_compress", None) is None
                and hasattr(pw, "_write_chunked_payload") and hasattr(pw, "_write"))

    def write_now(self, data: bytes) -> None:
        """``write`` without a coroutine, from a plain callback (``writes_now`` must hold): the same check,
        the same framing (chunked or not) and accounting as aiohttp's own write, and no drain (the transport
        buffers, and the limit bounds what it may hold)."""
        self._check()
        pw = self.resp._payload_writer
        if pw.chunked:
            pw._write_chunked_payload(data)
        else:
            pw._write(data)

    async def write_eof(self, data: bytes) -> None:
        """``data`` and the end of the body (one write), after the check of ``write``."""
        self._check()
        await self.resp.write_eof(data)

    def stalled(self, exc: StreamStalled, what: str, count: Callable[[], None]) -> web.StreamResponse:
        """Log the stall of ``what`` (the request), count it, and drop the connection (its buffer would never
        drain, so it is aborted, not closed); returns the response, marked ``STALLED`` (HTTP 499 in the
        request metrics), for the handler to return: aiohttp's end of it meets the dropped connection and
        lets it be."""
        log.warning("%s: the client stopped reading (%s): request aborted, connection dropped", what, exc)
        count()
        if self.transport is not None:
            self.transport.abort()
        self.resp[STALLED] = True
        return self.resp


class TokenCount:
    """Tokens a response streamed and has not yet told ``tell`` (a metrics counter, which takes a lock):
    told in batches of ``TOKENS_PER_COUNT`` and once at the end."""

    __slots__ = ("n", "tell")

    def __init__(self, tell: Callable[[int], None]):
        self.n = 0
        self.tell = tell

    def flush_some(self) -> None:
        """Tell once a batch has gathered."""
        if self.n >= TOKENS_PER_COUNT:
            self.flush()

    def flush(self) -> None:
        if self.n:
            self.tell(self.n)
            self.n = 0


async def pump_deltas(gen: Generation, writer: BoundedWriter, events: list[bytes],
                      add: Callable[[list], None]) -> None:
    """A streamed response's steady state, once its headers are out (``writer.writes_now``): until every
    choice of ``gen`` is finished, what arrives is taken and written by a pump the inbox calls in the turn
    after the engine reader's, while this coroutine waits for the end (no wake-up of the handler per token).

    ``add(deltas)`` turns a ``gen.take()`` into events appended to ``events``; the pump writes them in one
    ``write_now`` per turn. A failure in the pump (a stall, a reset connection, an engine failure from
    ``take``) and the inbox's own (client gone, engine silent) are raised here; the pump stops at the
    first. ``events`` is left holding the events of the last take, for the caller's final write."""
    failed = False

    def pump() -> None:
        nonlocal failed
        if failed:
            return
        try:
            while True:
                add(gen.take())
                if gen.done:
                    gen.inbox.wake()
                    return
                if events:
                    writer.write_now(events[0] if len(events) == 1 else b"".join(events))
                    events.clear()
                if not gen.pending:  # a failure queued behind the deltas just written is taken next
                    return
        except Exception as exc:
            failed = True
            gen.inbox.fail(exc)

    gen.inbox.pump_with(pump)
    try:
        while not gen.done:
            await gen.wait()
    finally:
        gen.inbox.pump_with(None)
