"""Cross-origin access for browsers: off unless ``--allowed-origins`` lists origins.

Without the flag no response carries a CORS header, so a web page can read
nothing it sends here, and a preflight (OPTIONS) is a 405 like any unrouted
method. With it, for an ``Origin`` on the list only:

    OPTIONS preflight   204, Access-Control-Allow-Origin: ORIGIN, -Allow-Methods (GET, POST, DELETE),
                        -Allow-Headers, -Max-Age, Vary: Origin, Access-Control-Request-Headers
    any other request   Access-Control-Allow-Origin: ORIGIN, -Expose-Headers (X-Request-Id,
                        request-id, Retry-After) and Vary: Origin on the response

The allowed headers are ``ALLOW_HEADERS`` and whatever else the preflight
asks for (``Access-Control-Request-Headers``: the SDKs' own, such as the
OpenAI SDK's ``x-stainless-*`` or Anthropic's
``anthropic-dangerous-direct-browser-access``), as long as each is a plain
header name: the origin is one the operator trusts, and every request still
needs its API key.

A preflight from an origin not on the list is a 403 without CORS headers.
Preflights need no API key (browsers send none); the requests they clear do.
"""

from __future__ import annotations

import re

from aiohttp import web

from ignis.gateway.errors import ApiError

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOW_HEADERS = ("Authorization, Content-Type, X-Ignis-Request-Class, X-Api-Key, X-Request-Id, Anthropic-Version, "
                 "Anthropic-Beta")
EXPOSE_HEADERS = "X-Request-Id, request-id, Retry-After"
"""Response headers a page may read: the request's id (OpenAI's and Anthropic's names) and a 429/503's wait."""
MAX_ASKED_CHARS = 2048
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
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
        "Access-Control-Allow-Headers": _allowed_headers(request.headers.get("Access-Control-Request-Headers", "")),
        "Access-Control-Max-Age": str(MAX_AGE_S), "Vary": "Origin, Access-Control-Request-Headers"})


def _allowed_headers(asked: str) -> str:
    """``ALLOW_HEADERS`` and the plain header names a preflight asks for beyond them."""
    known = {h.strip().lower() for h in ALLOW_HEADERS.split(",")}
    names = [h.strip() for h in asked.split(",")] if len(asked) <= MAX_ASKED_CHARS else []
    extra = [h for h in dict.fromkeys(n.lower() for n in names) if h not in known and _HEADER_NAME.fullmatch(h)]
    return ", ".join([ALLOW_HEADERS, *extra])


def add_origin_headers(request: web.Request, response: web.StreamResponse, origins: tuple[str, ...]) -> None:
    """Marks a response readable by the request's origin when it is on the list (before it is sent)."""
    origin = request.headers.get("Origin")
    if origins and origin in origins and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        response.headers["Vary"] = "Origin"
