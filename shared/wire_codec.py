"""Multipart framing of wire messages: header frame, version check, type registry.

    frame 0    orjson header {"type": <name>, "v": PROTOCOL_VERSION, <fields>...}
    frame 1..  raw little-endian arrays (``shared.wire_fields``), as many as the type declares

A message class registers itself with ``register`` and provides ``TYPE`` (its
header name), ``FRAMES`` (how many array frames follow the header),
``_header()`` (its JSON fields), ``_frames()`` and ``_decode(fields, frames)``.
``decode`` raises ``WireError`` and nothing else, whatever it is given.
"""

from __future__ import annotations

import orjson

from ignis.shared.wire_fields import HeaderFields, WireError

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change; a peer speaking another version is refused."""

MAX_HEADER_BYTES = 16 << 20

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make ``cls`` (with ``TYPE``, ``FRAMES``, ``_header``, ``_frames``, ``_decode``) decodable."""
    if cls.TYPE in _REGISTRY:
        raise ValueError(f"wire message type {cls.TYPE!r} is registered twice")
    _REGISTRY[cls.TYPE] = cls
    return cls


def encode(msg: object) -> list[bytes]:
    """The frames of ``msg``: header first, then its array frames."""
    if type(msg) not in _REGISTRY.values():
        raise WireError(f"{type(msg).__name__} is not a wire message")
    header = {"type": msg.TYPE, "v": PROTOCOL_VERSION, **msg._header()}
    return [orjson.dumps(header), *msg._frames()]


def decode(frames: object, accept: tuple[type, ...] | None = None) -> object:
    """Decode one multipart message; ``accept`` limits the types allowed here.

    Raises ``WireError`` with a clear message for anything malformed.
    """
    if not isinstance(frames, (list, tuple)):
        raise WireError(f"a message is a list of frames, got {type(frames).__name__}")
    if not frames:
        raise WireError("empty message (no header frame)")
    for i, frame in enumerate(frames):
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise WireError(f"frame {i} is {type(frame).__name__}, not bytes")
    if memoryview(frames[0]).nbytes > MAX_HEADER_BYTES:
        raise WireError(f"header frame over {MAX_HEADER_BYTES} bytes")
    try:
        header = orjson.loads(frames[0])
    except orjson.JSONDecodeError as e:
        raise WireError(f"header frame is not JSON: {e}") from None
    if type(header) is not dict:
        raise WireError(f"header must be a JSON object, got {type(header).__name__}")
    version = header.get("v")
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise WireError(f"protocol version {version!r}, this side speaks {PROTOCOL_VERSION}")
    type_name = header.get("type")
    cls = _REGISTRY.get(type_name) if type(type_name) is str else None
    if cls is None:
        raise WireError(f"unknown message type {type_name!r}")
    if accept is not None and cls not in accept:
        raise WireError(f"message type {type_name!r} is not accepted on this socket")
    if len(frames) != 1 + cls.FRAMES:
        raise WireError(f"{type_name} message has {len(frames)} frames, expected {1 + cls.FRAMES}")
    h = HeaderFields(header, type_name)
    try:
        msg = cls._decode(h, list(frames[1:]))
        h.done()
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(f"bad {type_name} message: {e}") from None
    return msg
