"""The gateway's asyncio side of the engine connection: one DEALER channel, many streams.

    engine ──ZeroMQ──> Channel I/O thread ──inbox──> (notify: call_soon_threadsafe) ──> _drain
        TokenBatch  -> each stream's share onto its request's inbox as (engine id, StreamTokens)
        Finished / Refused -> onto the queue, and the route is dropped
        StatsReply  -> the oldest waiting ``stats()`` call (the engine answers in order)

A request registers its engine ids on one queue (several choices share it),
sends its ``Generate`` messages, and reads the queue. ``last_seen`` is when the
engine last answered (an ErrorReply does not count: an engine that cannot
decode our messages is not serving us); a heartbeat task asks for Stats every
second, so a silent engine is noticed (``engine_alive``) and ``max_model_len``
stays known.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time

import zmq

from ignis.shared.wire import (
    ENGINE_TO_GATEWAY,
    Abort,
    ErrorReply,
    Finished,
    Generate,
    Refused,
    Stats,
    StatsReply,
    TokenBatch,
    Usage,
)
from ignis.shared.zmq_queues import connect_dealer

log = logging.getLogger("ignis.gateway")

HEARTBEAT_S = 1.0


class EngineUnavailable(RuntimeError):
    """The engine did not answer in time."""


class EngineClient:
    def __init__(self, endpoint: str, timeout: float = 10.0):
        self.endpoint = endpoint
        self.timeout = timeout
        self.last_seen: float | None = None
        self.stats_values: dict = {}
        self._engine_started: float | None = None  # the engine instance we talk to (its start time)
        self._routes: dict[str, object] = {}  # engine id -> its request's inbox (put_nowait)
        self._stats_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = threading.Event()
        self._ctx: zmq.Context | None = None
        self._channel = None
        self._heartbeat: asyncio.Task | None = None

    # ----- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.Context()
        self._channel = connect_dealer(self._ctx, self.endpoint, ENGINE_TO_GATEWAY, name="gateway",
                                       notify=self._notify).start()
        self._heartbeat = asyncio.create_task(self._beat())

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            try:
                await self._heartbeat
            except asyncio.CancelledError:
                pass
        if self._channel is not None:
            self._channel.close()
        if self._ctx is not None:
            self._ctx.term()

    # ----- requests ----------------------------------------------------------------------

    def open(self, messages: list[Generate], inbox) -> None:
        """Route the answers of ``messages`` to ``inbox`` (anything with ``put_nowait``), then send them."""
        for msg in messages:
            self._routes[msg.id] = inbox
        for msg in messages:
            self._channel.send(msg)

    def abort(self, engine_id: str, keep_route: bool = False) -> None:
        """Ask the engine to end a stream; without ``keep_route`` its remaining answers are dropped."""
        if engine_id in self._routes:
            if not keep_route:
                del self._routes[engine_id]
            self._channel.send(Abort(engine_id))

    def is_open(self, engine_id: str) -> bool:
        return engine_id in self._routes

    @property
    def engine_alive(self) -> bool:
        """The engine answered something within the timeout."""
        return self.last_seen is not None and time.monotonic() - self.last_seen < self.timeout

    async def stats(self, timeout: float = 1.0) -> dict:
        """The engine's StatsReply values; raises EngineUnavailable after ``timeout`` seconds."""
        fut = self._loop.create_future()
        self._stats_waiters.append(fut)
        self._channel.send(Stats())
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"the engine did not answer within {timeout:g} s") from None
        finally:
            if fut in self._stats_waiters:
                self._stats_waiters.remove(fut)

    async def max_model_len(self) -> int:
        """From the latest stats; asks the engine when none arrived yet."""
        if "max_model_len" not in self.stats_values:
            await self.stats()
        return int(self.stats_values["max_model_len"])

    # ----- incoming ------------------------------------------------------------------------

    def _notify(self) -> None:
        # Runs on the channel's I/O thread: schedule one drain per burst of messages.
        if not self._scheduled.is_set():
            self._scheduled.set()
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                pass  # the loop is closed; nothing is waiting any more

    def _drain(self) -> None:
        self._scheduled.clear()
        inbox = self._channel.inbox
        while True:
            try:
                msg = inbox.get_nowait().message
            except queue.Empty:
                return
            if not isinstance(msg, ErrorReply):  # an engine that cannot read us is not serving us
                self.last_seen = time.monotonic()
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, TokenBatch):
            routes = self._routes
            for stream in msg.streams:
                q = routes.get(stream.id)
                if q is not None:
                    q.put_nowait((stream.id, stream))
        elif isinstance(msg, (Finished, Refused)):
            q = self._routes.pop(msg.id, None)
            if q is not None:
                q.put_nowait((msg.id, msg))
        elif isinstance(msg, StatsReply):
            self.stats_values = msg.values
            started = msg.values.get("engine_started_unix")
            if started is not None:
                if self._engine_started is not None and started != self._engine_started:
                    self._fail_open_streams("the engine restarted; this request was lost, please retry")
                self._engine_started = started
            while self._stats_waiters:
                fut = self._stats_waiters.popleft()
                if not fut.done():
                    fut.set_result(msg.values)
                    break
        elif isinstance(msg, ErrorReply):
            log.error("the engine could not decode a message from this gateway: %s", msg.message)

    def _fail_open_streams(self, message: str) -> None:
        """A new engine answers on the same socket: the old one's streams will never finish."""
        log.warning("engine restarted: failing %d open streams", len(self._routes))
        routes, self._routes = self._routes, {}
        for engine_id, q in routes.items():
            q.put_nowait((engine_id, Finished(engine_id, "error", Usage(0, 0), message=message)))

    async def _beat(self) -> None:
        while True:
            try:
                await self.stats(timeout=max(HEARTBEAT_S, self.timeout))
            except EngineUnavailable:
                pass
            await asyncio.sleep(HEARTBEAT_S)
