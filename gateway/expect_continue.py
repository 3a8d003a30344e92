"""``Expect: 100-continue`` answered before the body is sent.

A client that asks first (curl does for bodies over 1 MB) is told at once
when the Content-Length it declares is past the request's body limit (the
same ``RequestLimits`` the handler reads within): a 413 in the API's error
shape, the connection closed, and no byte of the body read. Otherwise it is
told to go on (``100 Continue``), as aiohttp's own handler does; any other
expectation is a 417.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ignis.gateway.body import too_large
from ignis.gateway.errors import ApiError
from ignis.gateway.request_limits import RequestLimits
from ignis.gateway.state import STATE, GatewayState


def expect_continue(answer: Callable[[web.Request, ApiError], web.Response]
                    ) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """The routes' expect handler; ``answer`` shapes an error as the route's API does."""

    async def handle(request: web.Request) -> web.StreamResponse | None:
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":  # its value is not echoed: it may not even be text
            resp = answer(request, ApiError(417, "the only expectation understood is 'Expect: 100-continue'",
                                            code="expectation_failed"))
            resp.force_close()  # the client waits to send its body: nothing more is read on this connection
            return resp
        gw: GatewayState = request.app[STATE]
        limits = RequestLimits.of(gw)
        length = request.content_length
        if length is not None and length > limits.body_bytes:
            resp = answer(request, too_large(length, limits.body_bytes))
            resp.force_close()  # the body never comes: nothing is left to read on this connection
            return resp
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the response proper has not started (as aiohttp's own handler)
        return None

    return handle
