"""Where an ``image_url`` part's bytes come from: a ``data:`` URL, or an allowed http(s) host.

    data:[<image/...>][;base64],<base64 bytes>    decoded here (strict base64)
    http(s)://HOST/...                            fetched with aiohttp, only when HOST is one of
                                                  ``--allowed-media-domains``; no redirects followed,
                                                  at most ``max_bytes``, within ``timeout`` seconds

Anything else (another scheme, a host not allowed, corrupt base64, a non-image
media type, a body too large or too slow, an HTTP error) is an ``ImageError``
whose message says why; the caller answers 400. No torch.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from ignis.gateway.image_decode import ImageError

_CHUNK = 64 << 10


@dataclass(frozen=True)
class MediaPolicy:
    """What the gateway may read images from: the hosts it fetches from, and the limits."""

    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = 20 << 20
    timeout: float = 10.0


def data_url_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a base64 ``data:`` URL."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise ImageError("the data: URL has no ',' before its data")
    params = head[len("data:"):].split(";")
    media_type = params[0].strip().lower()
    if media_type and not media_type.startswith("image/"):
        raise ImageError(f"the data: URL holds {media_type!r}, not an image")
    if "base64" not in (p.strip().lower() for p in params[1:]):
        raise ImageError("the data: URL must be base64-encoded (data:image/png;base64,...)")
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        raise ImageError(f"the image is over {max_bytes} bytes")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URL's base64 is corrupt") from None
    if not data:
        raise ImageError("the data: URL holds no data")
    return data


async def fetch_image_bytes(url: str, policy: MediaPolicy) -> bytes:
    """The body of an http(s) image URL whose host ``policy`` allows."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not policy.allowed_domains:
        raise ImageError("remote image URLs are not allowed here (--allowed-media-domains lists none); "
                         "send the image as a data: URL")
    if host not in policy.allowed_domains:
        raise ImageError(f"images from {host or 'that URL'!r} are not allowed (--allowed-media-domains)")
    try:
        timeout = aiohttp.ClientTimeout(total=policy.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ImageError(f"fetching the image answered HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > policy.max_bytes:
                    raise ImageError(f"the image is over {policy.max_bytes} bytes")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    body += chunk
                    if len(body) > policy.max_bytes:
                        raise ImageError(f"the image is over {policy.max_bytes} bytes")
                return bytes(body)
    except asyncio.TimeoutError:
        raise ImageError(f"fetching the image took more than {policy.timeout:g} s") from None
    except aiohttp.ClientError as e:
        raise ImageError(f"fetching the image failed: {type(e).__name__}") from None


async def image_bytes(url: object, policy: MediaPolicy) -> bytes:
    """The encoded bytes an ``image_url`` names."""
    if type(url) is not str or not url:
        raise ImageError("image_url.url must be a non-empty string")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return data_url_bytes(url, policy.max_bytes)
    if scheme in ("http", "https"):
        return await fetch_image_bytes(url, policy)
    raise ImageError("image_url.url must be a data: URL or an http(s) URL")
