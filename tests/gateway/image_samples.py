"""Encoded test pictures (PNG, JPEG, WebP, GIF) and data: URLs of them, made with Pillow."""

from __future__ import annotations

import base64
import io

from PIL import Image


def picture(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic picture with detail in every channel (so a resize is not trivial)."""
    raw = bytes(((x * 7 + y * 13 + c * 29 + seed * 31) ^ (x * y + seed)) & 0xFF
                for y in range(height) for x in range(width) for c in range(len(mode)))
    return Image.frombytes(mode, (width, height), raw)


def encoded(image: Image.Image, fmt: str = "PNG", **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    return buf.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}
