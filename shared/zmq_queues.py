"""Typed ZeroMQ channels: one socket, one I/O thread, two queues.

The compute loop never touches a socket. A ``Channel`` owns one ZeroMQ socket
and one thread that does all its I/O:

    peer ──frames──> [socket] ──decode──> inbox  (queue.Queue[Envelope]) ──> compute loop
    peer <──frames── [socket] <─encode─── outbox (send(), any thread)    <── compute loop

- The channel speaks the one protocol (``shared.wire_codec.WireProtocol``)
  that has all of its ``accept`` types; incoming frames are decoded with it,
  limited to those types. What fails to decode is garbage: it is counted
  (``garbage_count``, ``last_garbage``), and on a ROUTER socket the sender
  is answered with an ``ErrorReply`` naming the problem. The thread keeps
  running whatever arrives. An ``ErrorReply`` is never answered (no loops).
- ``send`` is thread safe: it puts the message on the outbox and wakes the
  I/O thread through a pipe, which the thread polls next to the socket. A
  ROUTER send needs the peer's identity (from the Envelope it answers).
- ``MAXMSGSIZE`` bounds what a peer can make us buffer.
- On a ROUTER, ``last_heard`` (peer -> monotonic time of its last decoded
  message, ``answer_now`` ones included) and ``unreachable`` (peers a send
  found gone: ROUTER_MANDATORY's EHOSTUNREACH; a peer leaves it when heard
  again) let the owner notice peers that went away. They are written by the
  I/O thread only; read them by key. A DEALER that promises to send at least
  once a second takes a ``heartbeat_routing_id()`` as its identity (the
  gateway's engine client does; ``is_heartbeating`` tells it by that), so its
  silence means something.

ROUTER is the serving side (engine for gateways, tierd for the engine),
DEALER the client side; ``bind_router`` and ``connect_dealer`` build both.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from ignis.shared.wire_codec import ErrorReply, WireError, protocol_of
from ignis.shared.log_limits import RateLimitedLog

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20
"""Largest multipart message a channel accepts (ZMQ_MAXMSGSIZE); a larger one drops the connection."""

_POLL_MS = 100  # how often the thread checks for close() when nothing happens
_RECV_BATCH = 256  # messages drained per wakeup before sends get a turn


@dataclass(frozen=True)
class Envelope:
    """A decoded message and who sent it (ROUTER identity; None on other sockets)."""

    peer: bytes | None
    message: object


class Channel:
    """Owns ``socket`` and its I/O thread; see the module docstring."""

    def __init__(
        self,
        socket: zmq.Socket,
        accept: tuple[type, ...],
        *,
        name: str = "channel",
        notify: Callable[[], None] | None = None,
        answer_now: Callable[[object], object | None] | None = None,
    ):
        """``notify`` is called (on the I/O thread) after each message is put on the inbox,
        e.g. ``lambda: loop.call_soon_threadsafe(event.set)`` for an asyncio consumer.
        ``answer_now(message)`` (on the I/O thread) may return a reply to send at once instead of
        queueing the message: the engine answers ``Stats`` this way, so a long round never delays it."""
        if not accept:
            raise ValueError("a channel must accept at least one message type")
        self.socket = socket
        self.accept = tuple(accept)
        self.protocol = protocol_of(self.accept)
        self.name = name
        self.inbox: queue.Queue[Envelope] = queue.Queue()
        self.garbage_count = 0
        self.last_garbage = ""
        self._garbage_log = RateLimitedLog(log)
        self._notify = notify
        self._answer_now = answer_now
        self._router = socket.type == zmq.ROUTER
        self.last_heard: dict[bytes, float] = {}
        self.unreachable: set[bytes] = set()
        self._outbox: deque[tuple[bytes | None, list[bytes]]] = deque()
        self._pending: deque[list[bytes]] = deque()  # encoded, not yet accepted by the socket
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"zmq-{name}", daemon=True)
        self._closed = False

    # ----- compute-loop side ------------------------------------------------

    def start(self) -> Channel:
        self._thread.start()
        return self

    def send(self, message: object, peer: bytes | None = None) -> None:
        """Queue ``message`` for sending; on a ROUTER ``peer`` is required."""
        if self._closed:
            raise RuntimeError(f"channel {self.name} is closed")
        if self._router and peer is None:
            raise ValueError(f"channel {self.name} is a ROUTER: send needs the peer identity")
        if not self._router and peer is not None:
            raise ValueError(f"channel {self.name} has a single peer: do not pass peer")
        frames = self.protocol.encode(message)  # raises WireError on the caller's thread, not the I/O thread
        self._outbox.append((peer, frames))
        self._wake()

    def get(self, timeout: float | None = None) -> Envelope:
        """The next inbound message; raises ``queue.Empty`` after ``timeout`` seconds."""
        return self.inbox.get(timeout=timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread, then close the socket (pending sends get ``timeout`` to leave)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.socket.close(linger=int(timeout * 1000))
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> Channel:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- I/O thread ---------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full, so the thread is already due to wake

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                events = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError as e:
                if e.errno == zmq.ETERM:
                    return
                raise
            if self._wake_r in events:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            try:
                if events.get(self.socket, 0) & zmq.POLLIN:
                    self._receive_some()
                self._send_some()
            except zmq.ZMQError as e:
                if e.errno == zmq.ETERM:
                    return
                log.exception("%s: socket error; the channel keeps running", self.name)
            except Exception:  # a bug must not silently end the thread
                log.exception("%s: unexpected error; the channel keeps running", self.name)
            # Wait for POLLOUT only while a send is blocked by the high-water mark.
            poller.modify(self.socket, zmq.POLLIN | (zmq.POLLOUT if self._pending else 0))
        try:
            self._send_some()  # last chance for queued replies before the socket closes
        except zmq.ZMQError:
            pass

    def _receive_some(self) -> None:
        for _ in range(_RECV_BATCH):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            peer = None
            if self._router:
                peer, frames = frames[0], frames[1:]
            try:
                message = self.protocol.decode(frames, self.accept)
            except WireError as e:
                self._garbage(peer, frames, str(e))
                continue
            if peer is not None:
                self.last_heard[peer] = time.monotonic()
                self.unreachable.discard(peer)
            if self._answer_now is not None:
                try:
                    reply = self._answer_now(message)
                except Exception:
                    log.exception("%s: answer_now failed", self.name)
                    reply = None
                if reply is not None:
                    encoded = self.protocol.encode(reply)
                    self._pending.append(encoded if peer is None else [peer, *encoded])
                    continue
            self.inbox.put(Envelope(peer, message))
            if self._notify is not None:
                try:
                    self._notify()
                except Exception:
                    log.exception("%s: notify callback failed", self.name)

    def _garbage(self, peer: bytes | None, frames: list[bytes], problem: str) -> None:
        self.garbage_count += 1
        self.last_garbage = problem
        self._garbage_log.warning("%s: dropped a malformed message: %s", self.name, problem)
        if not self._router or self._is_error_reply(frames):
            return
        self._pending.append([peer, *self.protocol.encode(ErrorReply(message=problem[:4000]))])

    def _is_error_reply(self, frames: list[bytes]) -> bool:
        try:
            return isinstance(self.protocol.decode(frames), ErrorReply)
        except WireError:
            return False

    def _send_some(self) -> None:
        while self._outbox:
            peer, frames = self._outbox.popleft()
            self._pending.append(frames if peer is None else [peer, *frames])
        while self._pending:
            try:
                self.socket.send_multipart(self._pending[0], zmq.NOBLOCK)
            except zmq.Again:
                return  # high-water mark: retry when the socket is writable
            except zmq.ZMQError as e:  # e.g. ROUTER_MANDATORY and an unknown peer
                if self._router and e.errno == zmq.EHOSTUNREACH:
                    peer = self._pending[0][0]
                    # one line when a peer goes, not one per message queued for it (a gone gateway's streams)
                    (log.debug if peer in self.unreachable else log.warning)(
                        "%s: send failed: %s (peer %r)", self.name, e, peer)
                    self.unreachable.add(peer)
                else:
                    log.warning("%s: send failed: %s", self.name, e)
            self._pending.popleft()


_HWM = 100_000  # messages queued per peer before a send waits (never silently dropped: see below)


def _configure(sock: zmq.Socket) -> zmq.Socket:
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, _HWM)
    sock.setsockopt(zmq.RCVHWM, _HWM)
    if sock.type == zmq.ROUTER:
        # A ROUTER at its high-water mark drops messages silently; mandatory routing makes it
        # say EAGAIN instead (the I/O thread retries when writable) and fail loudly for a gone peer.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer that reconnects under its fixed routing id (heartbeat_routing_id) takes the id over.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock


def open_to_network(endpoint: str) -> bool:
    """Whether ``endpoint`` is a tcp one reachable from beyond this host (a wildcard, a name or an address
    that is not loopback): ZeroMQ sockets take no credentials, so whoever reaches it is served."""
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
    return not (host == "localhost" or host == "::1" or host.startswith("127."))


def bind_router(ctx: zmq.Context, endpoint: str, accept: tuple[type, ...], **kwargs) -> Channel:
    """A serving channel bound at ``endpoint``; it answers garbage with ErrorReply."""
    sock = _configure(ctx.socket(zmq.ROUTER))
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        sock.close()
        raise OSError(f"cannot bind {endpoint}: {e}") from None
    if open_to_network(endpoint):
        log.warning("%s takes requests from anyone who can reach it: ZeroMQ sockets have no authentication "
                    "(the gateway's --api-key does not cover them); keep it on a trusted network", endpoint)
    return Channel(sock, accept, **kwargs)


HEARTBEAT_ID_PREFIX = b"hb-"
"""Routing ids of DEALERs that send something at least once a second (a gateway's Stats heartbeat)."""


def heartbeat_routing_id() -> bytes:
    """A fresh routing id that says "I heartbeat" (unique per connection: a ROUTER drops a duplicate)."""
    return HEARTBEAT_ID_PREFIX + os.urandom(8).hex().encode()


def is_heartbeating(peer: bytes) -> bool:
    return peer.startswith(HEARTBEAT_ID_PREFIX)


def connect_dealer(ctx: zmq.Context, endpoint: str, accept: tuple[type, ...], **kwargs) -> Channel:
    """A client channel connected to ``endpoint`` (ZeroMQ reconnects on its own; the ROUTER picks its
    identity)."""
    sock = _configure(ctx.socket(zmq.DEALER))
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close()
        raise OSError(f"cannot connect to {endpoint}: {e}") from None
    return Channel(sock, accept, **kwargs)
