"""A POST body read within a byte limit and a deadline, then parsed as one JSON object.

    Content-Length over the limit   413 at once, nothing read
    more bytes than the limit       413 as soon as they arrive (chunked bodies too)
    not all there in time           408, and the connection is closed after the answer
    not JSON / not an object        400 invalid_json

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


def parse_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_json")
    return body
