"""A client's request id: vLLM's ``X-Request-Id`` header (or the body's ``request_id``), kept end to end.

A client or a proxy in front of the server names a request so its logs and
ours can be joined. As vLLM does, a chat completion's id becomes
``chatcmpl-<that id>`` and a completion's ``cmpl-<that id>``; the engine's
request ids (its done lines, ``ignis engine``'s log) start with the response's
id, so ``grep <that id>`` finds the request in every process's log. Every
generation answer carries the id back in its ``X-Request-Id`` header (the
client's, else the response's own). The Responses and Messages APIs keep
their own ids (a stored response's id must be ours to give), and only echo
the header.

The id is at most ``MAX_CHARS`` printable ASCII characters without spaces
(else a 400 naming it). Clients may send one id twice, even at once: the
engine's ids add a random part after it, so two requests never share one.
"""

from __future__ import annotations

import re
import secrets

from aiohttp import web

from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields

HEADER = "X-Request-Id"
FIELD = "request_id"
MAX_CHARS = 128
_VALID = re.compile(r"[!-~]{1,%d}" % MAX_CHARS)
_ANSWER_ID = "ignis_request_id"
"""Where the id to echo is kept on the aiohttp request, for ``echo_header``."""


def client_request_id(http: web.Request, f: Fields) -> str | None:
    """The client's id for this request: the header, else the body's ``request_id``; None when neither."""
    header = http.headers.get(HEADER)
    if header is not None:
        f.passed_over(FIELD)
        return _checked(header, HEADER)
    value = f.str(FIELD, None, max_chars=MAX_CHARS)
    return None if value is None else _checked(value, FIELD)


def _checked(value: str, name: str) -> str:
    if not _VALID.fullmatch(value):
        raise invalid(f"{name} must be 1 to {MAX_CHARS} printable ASCII characters without spaces", name)
    return value


def response_id(prefix: str, client_id: str | None) -> str:
    """``prefix-<client id>``, or ``prefix-<random>`` when the client named none."""
    return f"{prefix}-{client_id}" if client_id is not None else f"{prefix}-{secrets.token_hex(12)}"


def engine_base(rid: str, client_id: str | None) -> str:
    """What the engine ids of response ``rid``'s choices start with: unique even when a client repeats an id."""
    return f"{rid}-{secrets.token_hex(4)}" if client_id is not None else rid


def remember(http: web.Request, value: str) -> None:
    """The id the answer's ``X-Request-Id`` header carries."""
    http[_ANSWER_ID] = value


async def echo_header(http: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: put the remembered id in the answer's header, before any byte is sent."""
    value = http.get(_ANSWER_ID)
    if value is not None:
        response.headers.setdefault(HEADER, value)  # an internal error's answer names its own (logged) id
