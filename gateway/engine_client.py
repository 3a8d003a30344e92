"""The gateway's asyncio side of the engine connection: one DEALER socket, many streams.

    engine ──ZeroMQ──> DEALER (zmq.asyncio, on the event loop) ──> one reader task ──> _dispatch
        TokenBatch  -> read as columns (``TokenColumns``: no object per stream; one without logprobs
                       by ``plain_token_columns``, a few checks and no generic decode); each stream's
                       share onto its request's inbox as (engine id, token ids, logprobs or None)
        PromptLogprobs, Admitted -> onto the inbox as (engine id, message, None)
        Finished / Refused -> onto the inbox as (engine id, message, None), and the route is dropped
        StatsReply  -> the oldest waiting ``stats()`` call (the engine answers in order)
        CacheFlushed, AdapterUpdated, Profiled, AdapterList -> the ``flush_cache()`` / ``update_adapter()`` /
                                   ``profile()`` / ``list_adapters()`` call that asked, by id

No I/O thread: the reader task takes the messages already queued on the
socket in one turn of the loop (no thread hop, no wake-up pipe per message;
at most ``MESSAGES_PER_TURN``, then it yields to the streams),
and sends go straight to the socket. A message that does not decode is
logged (rate limited), counted in ``garbage_count`` and dropped.

A request registers its engine ids on one queue (several choices share it),
sends its ``Generate`` messages, and reads that inbox. ``last_seen`` is when the
engine last answered (an ErrorReply does not count: an engine that cannot
decode our messages is not serving us); a heartbeat task asks for Stats every
second, so a silent engine is noticed (``engine_alive``) and ``max_model_len``
stays known. A monitor on the socket hears the connection drop the moment the
engine process dies: the engine counts as gone at once (``lost``: waiting
requests fail with 503 within a poll, questions waiting for an answer at
once, new ones are refused without being sent) until a restarted engine answers on the same endpoint. The connection's routing id says so (``heartbeat_routing_id``):
the engine aborts the requests of a gateway silent past its
``--gateway-silence-timeout``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ignis.shared.log_limits import RateLimitedLog
from ignis.shared.wire import (
    ENGINE_TO_GATEWAY,
    GATEWAY_ENGINE,
    Abort,
    AdapterList,
    AdapterUpdated,
    Admitted,
    CacheFlushed,
    FlushCache,
    ListAdapters,
    Profile,
    Profiled,
    ErrorReply,
    Finished,
    PromptLogprobs,
    Generate,
    Refused,
    Stats,
    StatsReply,
    TOKEN_COLUMNS,
    TokenColumns,
    Usage,
    WireError,
    plain_token_columns,
)
from ignis.shared.zmq_queues import MAX_MESSAGE_BYTES, heartbeat_routing_id

log = logging.getLogger("ignis.gateway")

HEARTBEAT_S = 1.0
CLOSE_WAIT_S = 2.0  # how long close waits for each of its tasks to end after its cancel
HWM = 100_000
"""Messages queued each way before ZeroMQ pushes back (as ``shared.zmq_queues``)."""
MESSAGES_PER_TURN = 256
"""Engine messages the reader takes in one turn of the loop at most: an engine faster than the gateway
cannot keep the loop from the streams' writes and the other requests."""


class EngineUnavailable(RuntimeError):
    """The engine did not answer in time."""


class EngineClient:
    def __init__(self, endpoint: str, timeout: float = 10.0):
        self.endpoint = endpoint
        self.timeout = timeout
        self.last_seen: float | None = None
        self.stats_values: dict = {}
        self.engine_models: tuple[str, ...] = ()  # the names the engine serves (empty until it says)
        self._engine_started: float | None = None  # the engine instance we talk to (its start time)
        self._routes: dict[str, object] = {}  # engine id -> its request's inbox (put_nowait)
        self._stats_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._answer_waiters: dict[str, asyncio.Future] = {}  # a FlushCache's or an adapter update's answer
        self._asked = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._monitor: asyncio.Task | None = None
        self._closing = False
        self.lost = False  # the connection dropped and no engine has answered since
        self._reconnected = False  # while lost: the socket connected again (a new engine bound the endpoint)
        self.garbage_count = 0
        self._garbage_log = RateLimitedLog(log)

    # ----- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.DEALER)
        # the routing id says this gateway heartbeats: the engine treats its silence as gone (gateway_watch)
        for option, value in ((zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES), (zmq.LINGER, 0), (zmq.SNDHWM, HWM),
                              (zmq.RCVHWM, HWM), (zmq.ROUTING_ID, heartbeat_routing_id())):
            sock.setsockopt(option, value)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            sock.close()
            raise OSError(f"cannot connect to {self.endpoint}: {e}") from None
        self._sock = sock
        self._reader = asyncio.create_task(self._read())
        self._heartbeat = asyncio.create_task(self._beat())
        self._monitor = asyncio.create_task(self._watch(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)))

    async def close(self) -> None:
        """Stop the reader, heartbeat and monitor, close the socket and the context. A task that had
        failed is logged, never left to stop the close: an open socket would hold the context's end; one
        that does not end within ``CLOSE_WAIT_S`` of its cancel is named and left behind.

        Python 3.11's ``asyncio.wait_for`` returns its future's result when the cancel arrives as that
        future completes, losing the cancel: the heartbeat then slept on and a close that awaited it
        never ended (a gateway stuck after SIGTERM). The waits here use ``asyncio.timeout`` and the
        heartbeat also stops on ``_closing``."""
        self._closing = True
        try:
            for name, task in (("monitor", self._monitor), ("heartbeat", self._heartbeat), ("reader", self._reader)):
                if task is None:
                    continue
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=CLOSE_WAIT_S)
                if not done:
                    log.warning("gateway: the engine connection's %s did not end %g s after its cancel; closing "
                                "without it", name, CLOSE_WAIT_S)
                elif not task.cancelled() and task.exception() is not None:
                    log.error("gateway: the engine connection's %s had failed", name, exc_info=task.exception())
        finally:
            if self._sock is not None:
                if self._monitor is not None:
                    self._sock.disable_monitor()
                self._sock.close(linger=0)
            if self._ctx is not None:
                self._ctx.destroy(linger=0)  # closes whatever socket is left (term alone would wait for it)

    def _send(self, msg) -> None:
        """Queue ``msg`` on the socket (ZeroMQ sends it on its own thread)."""
        fut = self._sock.send_multipart(GATEWAY_ENGINE.encode(msg))
        if not fut.done():  # at the high-water mark: it leaves when the socket has room
            fut.add_done_callback(_log_send_failure)
        elif fut.exception() is not None:
            _log_send_failure(fut)

    # ----- requests ----------------------------------------------------------------------

    def open(self, messages: list[Generate], inbox) -> None:
        """Route the answers of ``messages`` to ``inbox`` (anything with ``put_nowait``), then send them."""
        for msg in messages:
            self._routes[msg.id] = inbox
        for msg in messages:
            self._send(msg)

    def abort(self, engine_id: str, keep_route: bool = False, reason: str = "abort",
              kept_tokens: int | None = None) -> None:
        """Ask the engine to end a stream; without ``keep_route`` its remaining answers are dropped.
        ``reason`` "stop": its output is complete, ``kept_tokens`` of the tokens sent (``Abort``)."""
        if engine_id in self._routes:
            if not keep_route:
                del self._routes[engine_id]
            self._send(Abort(engine_id, reason, kept_tokens))

    @property
    def engine_alive(self) -> bool:
        """The engine answered something within the timeout."""
        return self.last_seen is not None and time.monotonic() - self.last_seen < self.timeout

    async def stats(self, timeout: float = 1.0) -> dict:
        """The engine's StatsReply values; raises EngineUnavailable after ``timeout`` seconds."""
        fut = self._loop.create_future()
        self._stats_waiters.append(fut)
        self._send(Stats())
        try:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's can swallow a cancel (see close)
                return await fut
        except TimeoutError:
            raise EngineUnavailable(f"the engine did not answer within {timeout:g} s") from None
        finally:
            if fut in self._stats_waiters:
                self._stats_waiters.remove(fut)

    async def flush_cache(self, timeout: float = 30.0) -> CacheFlushed:
        """Ask the engine to drop every retained entry in every tier (``engine.cache_flushes``); its answer.
        Raises EngineUnavailable while ``lost`` or after ``timeout`` seconds."""
        return await self._ask(FlushCache, (), "the cache reset", timeout)

    async def update_adapter(self, make, *fields, timeout: float = 60.0) -> AdapterUpdated:
        """Send ``make(id, *fields)`` (``LoadAdapter`` or ``UnloadAdapter``); the engine's answer."""
        return await self._ask(make, fields, "the LoRA adapter update", timeout)

    async def profile(self, start: bool, rounds: int = 0, timeout: float = 300.0) -> Profiled:
        """Start or stop the engine's profiler (``engine.profiling``); its answer (a stop writes the trace
        on the engine's loop: a long profile's takes a while)."""
        return await self._ask(Profile, (start, rounds), "the profiler", timeout)

    async def list_adapters(self, timeout: float = 10.0) -> AdapterList:
        """The LoRA adapters the engine serves now (``gateway.adapter_sync``)."""
        return await self._ask(ListAdapters, (), "the LoRA adapter list", timeout)

    async def _ask(self, make, fields: tuple, what: str, timeout: float):
        if self.lost:
            raise EngineUnavailable("the engine went away; it is being restarted")
        self._asked += 1
        aid = f"ask-{id(self):x}-{self._asked}"
        fut = self._loop.create_future()
        self._answer_waiters[aid] = fut
        self._send(make(aid, *fields))
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise EngineUnavailable(f"the engine did not answer {what} within {timeout:g} s") from None
        finally:
            self._answer_waiters.pop(aid, None)

    async def max_model_len(self, index: int | None = None) -> int:
        """From the latest stats (asks the engine when none arrived yet): the context length of the served
        model at ``index`` in the engine's list when the engine says it, else the loaded (or last loaded)
        model's. EngineUnavailable while ``lost``."""
        if self.lost:
            raise EngineUnavailable("the engine went away; it is being restarted")
        if "max_model_len" not in self.stats_values:
            await self.stats()
        values = self.stats_values
        return int(values.get(f"max_model_len_{index}", values["max_model_len"]))

    # ----- incoming ------------------------------------------------------------------------

    async def _read(self) -> None:
        """The one reader: every engine message, decoded and dispatched in arrival order."""
        sock = self._sock
        queued = zmq.Socket.shadow(sock.underlying)  # the same socket, read without a future per message
        while True:
            frames = await sock.recv_multipart()
            self._take(frames)
            for _ in range(MESSAGES_PER_TURN - 1):  # what is already queued, this turn
                try:
                    frames = queued.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(frames)
            else:  # more may be queued: let the streams write what they got first
                await asyncio.sleep(0)

    def _take(self, frames: list[bytes]) -> None:
        msg = plain_token_columns(frames)  # the steady state's TokenBatch, without the generic decode
        if msg is None:
            try:
                msg = GATEWAY_ENGINE.decode(frames, ENGINE_TO_GATEWAY, TOKEN_COLUMNS)
            except WireError as e:
                self.garbage_count += 1
                self._garbage_log.warning("gateway: dropped a malformed message from the engine: %s", e)
                return
        if not isinstance(msg, ErrorReply) and not self.lost:  # an engine that cannot read us is not serving us
            self.last_seen = time.monotonic()
        try:
            self._dispatch(msg)
        except Exception:  # a bug in one message's handling must not end the reader
            log.exception("gateway: failed to dispatch a %s", type(msg).__name__)

    def _dispatch(self, msg) -> None:
        if type(msg) is TokenColumns:
            routes, tokens, lps = self._routes, msg.tokens, msg.logprobs
            if lps is None and len(tokens) == len(msg.ids):  # one token each: the steady state
                for sid, token in zip(msg.ids, tokens):
                    q = routes.get(sid)
                    if q is not None:
                        q.put_nowait((sid, (token,), None))
                return
            at = 0
            for i, (sid, c) in enumerate(zip(msg.ids, msg.counts)):
                q = routes.get(sid)
                if q is not None:
                    q.put_nowait((sid, tokens[at:at + c], None if lps is None else lps[i]))
                at += c
        elif isinstance(msg, (Finished, Refused)):
            q = self._routes.pop(msg.id, None)
            if q is not None:
                q.put_nowait((msg.id, msg, None))
        elif isinstance(msg, (PromptLogprobs, Admitted)):
            q = self._routes.get(msg.id)
            if q is not None:
                q.put_nowait((msg.id, msg, None))
        elif isinstance(msg, StatsReply):
            if self.lost:
                if not self._reconnected:
                    return  # the gone engine's last word, read after the drop
                self.lost = False
                self.last_seen = time.monotonic()
                log.info("an engine answers again")
            self.stats_values = msg.values
            self.engine_models = msg.models
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
        elif isinstance(msg, (CacheFlushed, AdapterUpdated, Profiled, AdapterList)):
            fut = self._answer_waiters.get(msg.id)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, ErrorReply):
            log.error("the engine could not decode a message from this gateway: %s", msg.message)

    def _fail_open_streams(self, message: str) -> None:
        """A new engine answers on the same socket: the old one's streams will never finish."""
        log.warning("engine restarted: failing %d open streams", len(self._routes))
        routes, self._routes = self._routes, {}
        for engine_id, q in routes.items():
            q.put_nowait((engine_id, Finished(engine_id, "error", Usage(0, 0), message=message), None))

    def _fail_questions(self) -> None:
        """The engine is gone: a question waiting for its answer (Stats, a cache flush, an adapter update, a
        profile) fails now rather than at its own timeout (up to minutes)."""
        waiters, self._answer_waiters = list(self._answer_waiters.values()) + list(self._stats_waiters), {}
        self._stats_waiters.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(EngineUnavailable("the engine went away before it answered; it is being "
                                                    "restarted"))

    async def _watch(self, monitor) -> None:
        """The socket's connection events: a drop means the engine process is gone (or restarting)."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    self._reconnected = False
                    if not self.lost:
                        self.lost = True
                        self.last_seen = None
                        log.warning("the engine connection dropped: requests get 503 until an engine answers again")
                        self._fail_questions()
                elif event["event"] == zmq.EVENT_CONNECTED and self.lost:
                    self._reconnected = True
        finally:
            monitor.close(linger=0)

    async def _beat(self) -> None:
        while not self._closing:
            try:
                await self.stats(timeout=max(HEARTBEAT_S, self.timeout))
            except EngineUnavailable:
                pass
            await asyncio.sleep(HEARTBEAT_S)


def _log_send_failure(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("gateway: a message to the engine was not sent: %s", fut.exception())
