"""A POST body read within a byte limit and a deadline, then parsed as one JSON object.

    Content-Length over the limit   413 at once, nothing read
    more bytes than the limit       413 as soon as they arrive (chunked bodies too)
    not all there in time           408, and the connection is closed after the answer
    not JSON / not an object        400 invalid_json
    a Content-Encoding aiohttp      415 unsupported_content_encoding, nothing read (it decodes gzip,
    does not decode                 deflate, and br or zstd when their modules are installed, on the
                                    way in; the byte limit counts decoded bytes, so a compressed bomb
                                    stops at the limit)

The limit and deadline come from the caller (``RequestLimits.body_bytes``,
``--body-read-timeout``).
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from ignis.gateway.errors import ApiError, invalid


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the request body is {size} bytes or more, at most {limit} allowed (--max-request-bytes)",
                    code="request_too_large")


async def read_body(request: web.Request, limit: int, timeout: float) -> bytes:
    _check_encoding(request.headers.get("Content-Encoding", ""))
    length = request.content_length
    if length is not None and length > limit:
        raise too_large(length, limit)
    buf = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                buf += chunk
                if len(buf) > limit:
                    raise too_large(len(buf), limit)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (--body-read-timeout)",
                       code="body_timeout", close=True) from None
    return bytes(buf)


def _decoded_codings() -> frozenset[str]:
    """The Content-Encoding values aiohttp decodes here: its parser takes exactly one of gzip, deflate, br,
    zstd (the whole header, not a list), br and zstd only with their modules."""
    from aiohttp import compression_utils

    codings = {"gzip", "deflate"}
    if getattr(compression_utils, "HAS_BROTLI", False):
        codings.add("br")
    if getattr(compression_utils, "HAS_ZSTD", False):
        codings.add("zstd")
    return frozenset(codings)


CODINGS = _decoded_codings() | {"", "identity"}
"""Content-Encoding values a request body may come in (anything else is a 415: it would be read undecoded)."""


def _check_encoding(header: str) -> None:
    coding = header.strip().lower()
    if coding not in CODINGS:
        raise ApiError(415, f"Content-Encoding {header[:64]!r} is not supported: send the body as it is, or "
                            f"{' or '.join(sorted(CODINGS - {'', 'identity'}))} it (one coding)",
                       code="unsupported_content_encoding")


def parse_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_json")
    return body
