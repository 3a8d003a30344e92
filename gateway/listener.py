"""The HTTP listening socket: a cap on open connections and a deadline on each request's headers.

aiohttp's own ``RequestHandler`` does the HTTP; each connection's protocol is a
``GuardedConnection`` in front of it that passes every event through and keeps
one state:

    IDLE ──first byte──> HEADERS ──the app sees the request──> IN_REQUEST ──handler done──> IDLE
                            └── --header-read-timeout passes ──> connection closed

aiohttp closes a connection idle for ``--keepalive-timeout`` (also one that
sends nothing after it opens); the body has ``--body-read-timeout``
(gateway.body). At ``--max-connections`` open connections a new one takes
the place of the oldest that is not in a request (idle between requests, or
still sending its headers): that one is closed. Only when every open
connection is in a request is the new one answered 503 at its first byte (or
closed after the header deadline), never reaching aiohttp. So connections
that hold a slot without ever finishing their headers (a slow-headers
client) cannot keep others out: each new one displaces them.

A request aiohttp's parser refuses (a duplicate Content-Length, a header past
its bound) is answered with an OpenAI error object like every other error
(``json_parser_errors``; aiohttp's own answer is plain text), code
``malformed_http``, and the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from http import HTTPStatus

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("ignis.gateway")

CONNECTIONS = web.AppKey("ignis_connections", object)
LINGER_S = 2.0
"""After an answer sent before its body was read (413, 408), aiohttp reads and drops the rest this long."""

_REFUSAL_BODY = orjson.dumps({"error": {
    "message": "the server has too many open connections (--max-connections); try again shortly",
    "type": "service_unavailable_error", "param": None, "code": "too_many_connections"}})
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
           b"Connection: close\r\nContent-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY)


class Connections:
    """The protocol factory of the listening socket; ``attach`` aiohttp's server before serving."""

    def __init__(self, max_connections: int, header_timeout: float):
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open = 0
        self.refused = 0
        self.displaced = 0  # connections closed to make room for a new one
        self.closing = 0  # displaced ones whose close has not completed yet
        self.server: web.Server | None = None
        self._by_transport: dict[object, GuardedConnection] = {}

    def attach(self, server: web.Server) -> None:
        self.server = server

    def __call__(self) -> asyncio.Protocol:
        return GuardedConnection(self)

    def make_room(self) -> bool:
        """At the cap: close the oldest connection not in a request; False when every one is in a request."""
        for conn in self._by_transport.values():  # in the order they were opened
            if conn.state in ("IDLE", "HEADERS"):
                conn.displace()
                self.displaced += 1
                return True
        return False

    def request_started(self, request: web.Request) -> None:
        conn = self._by_transport.get(request.transport)
        if conn is not None:
            conn.in_request()

    def request_done(self, request: web.Request) -> None:
        conn = self._by_transport.get(request.transport)
        if conn is not None:
            conn.idle()


class GuardedConnection(asyncio.Protocol):
    """One client connection: aiohttp's protocol behind a header deadline, or a refusal."""

    def __init__(self, owner: Connections):
        self.owner = owner
        self.inner = None  # aiohttp's RequestHandler, unless refused
        self.transport: asyncio.Transport | None = None
        self.state = "IDLE"
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        owner = self.owner
        if owner.open - owner.closing >= owner.max_connections and not owner.make_room():
            owner.refused += 1
            self.state = "REFUSED"
            self._arm(transport.close)
            return
        owner.open += 1
        owner._by_transport[transport] = self
        self.inner = json_parser_errors(owner.server())
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            self._cancel()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(REFUSAL)
                self.transport.close()
            return
        if self.state == "IDLE":
            self.state = "HEADERS"
            self._arm(self._headers_late)
        self.inner.data_received(data)

    def _headers_late(self) -> None:
        if self.state == "HEADERS" and self.transport is not None:
            log.info("closing a connection whose request headers did not arrive within %g s",
                     self.owner.header_timeout)
            self.transport.close()

    def displace(self) -> None:
        self.state = "DISPLACED"
        self._cancel()
        self.owner.closing += 1
        if self.transport is not None:
            self.transport.close()

    def in_request(self) -> None:
        if self.state != "DISPLACED":  # its close is under way: it is counted as closing until it is lost
            self.state = "IN_REQUEST"
        self._cancel()

    def idle(self) -> None:
        if self.state != "DISPLACED":
            self.state = "IDLE"

    def _arm(self, callback) -> None:
        self._cancel()
        self._timer = asyncio.get_running_loop().call_later(self.owner.header_timeout, callback)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self.inner is None:
            return
        self.owner.open -= 1
        if self.state == "DISPLACED":
            self.owner.closing -= 1
        self.owner._by_transport.pop(self.transport, None)
        self.inner.connection_lost(exc)


async def listen(runner: web.AppRunner, connections: Connections, host: str, port: int,
                 tls: ssl.SSLContext | None = None, handshake_timeout: float = 10.0) -> asyncio.AbstractServer:
    """Serve ``runner``'s app on HOST:PORT through ``connections`` (``runner.setup()`` done); with ``tls``,
    HTTPS, a handshake given ``handshake_timeout`` seconds."""
    connections.attach(runner.server)
    loop = asyncio.get_running_loop()
    if tls is None:
        return await loop.create_server(connections, host, port, backlog=512, reuse_address=True)
    return await loop.create_server(connections, host, port, backlog=512, reuse_address=True, ssl=tls,
                                    ssl_handshake_timeout=handshake_timeout)


class _JsonErrors(RequestHandler):
    """aiohttp's ``RequestHandler`` answering its parser's refusals as OpenAI error objects."""

    __slots__ = ()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None):
        super().handle_error(request, status, exc, message)  # logs (quietly: protocol_errors_log); raises once
        if status >= 500:                                     # bytes went out
            text, kind, code = "internal error", "internal_error", "internal_error"
        else:
            detail = " ".join(str(message or "").split())[:200] or HTTPStatus(status).phrase
            text, kind, code = f"malformed HTTP request: {detail}", "invalid_request_error", "malformed_http"
        resp = web.Response(status=status, content_type="application/json", body=orjson.dumps(
            {"error": {"message": text, "type": kind, "param": None, "code": code}}))
        resp.force_close()
        return resp


def json_parser_errors(handler):
    """``handler`` (what aiohttp's ``Server`` made) answering its parser's refusals as OpenAI error objects;
    a handler of another class (a future aiohttp's) is left as it is, its errors plain text."""
    if type(handler) is RequestHandler:
        handler.__class__ = _JsonErrors  # the same slots: only the method changes
    return handler
