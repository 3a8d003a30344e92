"""Cross-origin access for browsers: off unless ``--allowed-origins`` lists origins.

Without the flag no response carries a CORS header, so a web page can read
nothing it sends here, and a preflight (OPTIONS) is a 405 like any unrouted
method. With it, for an ``Origin`` on the list only:

    OPTIONS preflight   204, Access-Control-Allow-Origin: ORIGIN, -Allow-Methods, -Allow-Headers,
                        -Max-Age, Vary: Origin
    any other request   Access-Control-Allow-Origin: ORIGIN and Vary: Origin on the response

A preflight from an origin not on the list is a 403 without CORS headers.
Preflights need no API key (browsers send none); the requests they clear do.
"""

from __future__ import annotations

from aiohttp import web

from ignis.gateway.errors import ApiError

ALLOW_METHODS = "GET, POST, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, X-Ignis-Request-Class, X-Api-Key, Anthropic-Version, Anthropic-Beta"
MAX_AGE_S = 600


def is_preflight(request: web.Request) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def preflight(request: web.Request, origins: tuple[str, ...]) -> web.Response:
    """The answer to a preflight (``is_preflight``)."""
    origin = request.headers.get("Origin", "")
    if not origins:
        raise ApiError(405, "method not allowed on this route", code="method_not_allowed")
    if origin not in origins:
        raise ApiError(403, f"the origin {origin!r} is not allowed (--allowed-origins)", code="origin_not_allowed")
    return web.Response(status=204, headers={
        "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ALLOW_HEADERS, "Access-Control-Max-Age": str(MAX_AGE_S), "Vary": "Origin"})


def add_origin_headers(request: web.Request, response: web.StreamResponse, origins: tuple[str, ...]) -> None:
    """Marks a response readable by the request's origin when it is on the list (before it is sent)."""
    origin = request.headers.get("Origin")
    if origins and origin in origins and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"
