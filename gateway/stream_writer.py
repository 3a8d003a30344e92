"""A streamed response's writes, with a bound on what a client that stops reading can leave buffered.

The gateway never waits for a slow client: a write goes into the connection's
write buffer (the transport's, in user space) and returns, so its stream keeps
taking its engine output and no backlog builds anywhere else. What a client
has not taken stays in that buffer, and ``write`` refuses to let it pass
``limit`` bytes (``--stream-buffer-bytes``): it raises ``StreamStalled``
instead. The transport's own high-water mark is set above the limit, so a
write never parks the handler in aiohttp's drain.

    writer = BoundedWriter(resp, request.transport, limit)
    await writer.write(chunk)   # StreamStalled: the buffer would pass the limit

The caller ends the request on ``StreamStalled`` (``stalled``: the engine
streams aborted by the Generation's close, the connection dropped, a log line,
``ignis:gateway_stream_stalled_aborts_total``).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from ignis.gateway.config import GatewayConfig
from ignis.gateway.generation import ClientGone

log = logging.getLogger("ignis.gateway")

DEFAULT_STREAM_BUFFER_BYTES = GatewayConfig.stream_buffer_bytes


class StreamStalled(ClientGone):
    """The client stopped reading: its unwritten output would pass the stream buffer limit."""

    def __init__(self, buffered: int, limit: int):
        super().__init__(f"{buffered} bytes of output unwritten, past the limit of {limit}")
        self.buffered = buffered
        self.limit = limit


class BoundedWriter:
    """Writes of one streamed response; ``limit`` bytes at most waiting in the connection's write buffer."""

    def __init__(self, resp: web.StreamResponse, transport: asyncio.Transport | None, limit: int):
        self.resp = resp
        self.transport = transport
        self.limit = limit
        if transport is not None:
            transport.set_write_buffer_limits(high=2 * limit + (1 << 16))  # the bound below pauses first

    async def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None:
            buffered = t.get_write_buffer_size() + len(data)
            if buffered > self.limit:
                raise StreamStalled(buffered, self.limit)
        await self.resp.write(data)

    def stalled(self, exc: StreamStalled, what: str, count) -> None:
        """Log the stall of ``what`` (the request's id), count it, and drop the connection: its buffer would
        never drain, so it is aborted, not closed."""
        log.warning("%s: the client stopped reading (%s): request aborted, connection dropped", what, exc)
        count()
        if self.transport is not None:
            self.transport.abort()
