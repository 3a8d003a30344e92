"""One image of a request, as the gateway hands it to the engine.

The gateway decodes an ``image_url`` part and resizes it to the patch grid of
the vision tower; what crosses the wire is the resized picture as raw
row-major RGB bytes (never pickled), its size, and a content digest of exactly
those bytes and that size. The engine normalises and patchifies the pixels;
the digest is the image's identity in reuse keys (the same picture resized the
same way is the same image; a different picture of the same size is not).
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass

DIGEST_BYTES = 16


def check_rgb_size(pixels: bytes, height: int, width: int) -> None:
    """Refuse a size that is not positive or does not match the byte count."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if len(pixels) != height * width * 3:
        raise ValueError(f"image of {height}x{width} needs {height * width * 3} bytes, got {len(pixels)}")


def image_digest(pixels: bytes, height: int, width: int) -> bytes:
    """The content identity of a resized RGB picture: BLAKE2b over size and bytes."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"ignis-image")
    h.update(height.to_bytes(4, "little"))
    h.update(width.to_bytes(4, "little"))
    h.update(pixels)
    return h.digest()


@dataclass(frozen=True)
class ImageInput:
    """A resized RGB picture: ``height * width * 3`` uint8 bytes, row-major."""

    pixels: bytes
    height: int
    width: int
    digest: bytes

    def __post_init__(self):
        check_rgb_size(self.pixels, self.height, self.width)
        if len(self.digest) != DIGEST_BYTES:
            raise ValueError(f"image digest must be {DIGEST_BYTES} bytes, got {len(self.digest)}")

    @classmethod
    def from_rgb(cls, pixels: bytes, height: int, width: int) -> "ImageInput":
        """Wrap resized RGB bytes, computing their digest."""
        check_rgb_size(pixels, height, width)
        return cls(bytes(pixels), height, width, image_digest(pixels, height, width))
