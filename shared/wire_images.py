"""Images on the wire: a message field of resized pictures, each its own raw frame.

A field declared ``ImageFrames`` (a tuple of ``shared.image_input.ImageInput``)
travels in two parts:

    header     "<name>": [[height, width, "<digest hex>"], ...]   (left out when there are none)
    frames     one frame per image, after the message's token frames, in the same order:
               | height * width * 3 bytes of row-major RGB, uint8 |

Never pickled. Reading checks the header entries' types and bounds, that
there is exactly one frame per entry, that each frame holds exactly
``height * width * 3`` bytes, and that the digest is the content digest of
those bytes and that size (a digest is a reuse key: a wrong one must not
reach the engine). No torch.
"""

from __future__ import annotations

from typing import Annotated

from ignis.shared.image_input import DIGEST_BYTES, ImageInput, image_digest
from ignis.shared.wire_fields import WireError

ImageFrames = Annotated[tuple[ImageInput, ...], "resized RGB pictures, one raw frame each"]
"""Declared type of a message field whose images travel as frames (layout above)."""

MAX_IMAGES = 256
"""Most images one message may carry."""

MAX_IMAGE_SIDE = 1 << 15
MAX_IMAGE_PIXELS = 1 << 26
"""Largest picture (pixels) one frame may hold: 192 MiB of RGB."""

MAX_MESSAGE_IMAGE_BYTES = 1 << 30
"""Most image bytes one message may carry in all."""


def check_images(name: str, value: object) -> tuple[ImageInput, ...]:
    """A tuple of ImageInputs within the wire's bounds; lists are accepted."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a list of images, got {type(value).__name__}")
    if len(value) > MAX_IMAGES:
        raise ValueError(f"{name} holds {len(value)} images, at most {MAX_IMAGES} allowed")
    total = 0
    for i, image in enumerate(value):
        if not isinstance(image, ImageInput):
            raise TypeError(f"{name}[{i}] must be an ImageInput, got {type(image).__name__}")
        _check_size(f"{name}[{i}]", image.height, image.width)
        total += len(image.pixels)
    if total > MAX_MESSAGE_IMAGE_BYTES:
        raise ValueError(f"{name} hold {total} bytes, at most {MAX_MESSAGE_IMAGE_BYTES} allowed")
    return tuple(value)


def _check_size(name: str, height: object, width: object) -> None:
    for side, v in (("height", height), ("width", width)):
        if type(v) is not int or not 1 <= v <= MAX_IMAGE_SIDE:
            raise ValueError(f"{name} {side} must be an integer in [1, {MAX_IMAGE_SIDE}], got {v!r}")
    if height * width > MAX_IMAGE_PIXELS:
        raise ValueError(f"{name} is {height}x{width}, over {MAX_IMAGE_PIXELS} pixels")


def images_to_wire(images: tuple[ImageInput, ...]) -> tuple[list, list[bytes]]:
    """The header entries and the frames of ``images``."""
    return [[im.height, im.width, im.digest.hex()] for im in images], [im.pixels for im in images]


def images_from_wire(name: str, entries: object, frames: list) -> tuple[ImageInput, ...]:
    """Rebuild images from their header entries and frames; ``WireError`` for anything malformed."""
    if type(entries) is not list or len(entries) > MAX_IMAGES:
        raise WireError(f"{name} must be a list of at most {MAX_IMAGES} [height, width, digest] entries")
    if len(entries) != len(frames):
        raise WireError(f"{name} names {len(entries)} images but {len(frames)} image frames came")
    out, total = [], 0
    for i, (entry, frame) in enumerate(zip(entries, frames)):
        where = f"{name}[{i}]"
        if type(entry) is not list or len(entry) != 3 or type(entry[2]) is not str:
            raise WireError(f"{where} must be a [height, width, digest] entry")
        height, width, digest_hex = entry
        try:
            _check_size(where, height, width)
        except ValueError as e:
            raise WireError(str(e)) from None
        if len(digest_hex) != 2 * DIGEST_BYTES:
            raise WireError(f"{where} digest must be {2 * DIGEST_BYTES} hex digits")
        try:
            digest = bytes.fromhex(digest_hex)
        except ValueError:
            raise WireError(f"{where} digest is not hex") from None
        pixels = bytes(frame)
        if len(pixels) != height * width * 3:
            raise WireError(f"{where} frame is {len(pixels)} bytes, a {height}x{width} RGB picture is "
                            f"{height * width * 3}")
        total += len(pixels)
        if total > MAX_MESSAGE_IMAGE_BYTES:
            raise WireError(f"{name} hold more than {MAX_MESSAGE_IMAGE_BYTES} bytes")
        if image_digest(pixels, height, width) != digest:
            raise WireError(f"{where} digest does not match its pixels")
        out.append(ImageInput(pixels, height, width, digest))
    return tuple(out)
