"""The wire codec: typed dataclass messages as ZeroMQ multipart frames.

    frame 0    orjson header {"type": <TYPE>, "v": PROTOCOL_VERSION, <field>: <JSON value>, ...}
    frame 1..  one raw little-endian int32 frame per ``TokenFrame`` field, in field order
               (``shared.wire_fields``)

A message is a frozen dataclass with a ``TYPE`` name. By default its fields
travel in the header in declaration order, each as ``shared.wire_values``
maps its declared type to JSON and back (strictly), except ``TokenFrame``
fields, which travel as frames. Every field is in every header: none may be
left out, none added. A class whose layout is not one value per field
(``TokenBatch``: columns plus one frame for all streams) defines ``FRAMES``,
``to_wire() -> (fields, frames)`` and ``from_wire(fields, frames)`` instead.

``decode`` raises ``WireError`` and nothing else, whatever it is given. No pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import orjson

from ignis.shared.wire_fields import TokenFrame, WireError, frame_to_tokens, tokens_to_frame
from ignis.shared.wire_values import check_field_names, field_types, from_json, to_json

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change; a peer speaking another version is refused."""

MAX_HEADER_BYTES = 16 << 20

_REGISTRY: dict[str, type] = {}


@dataclass(frozen=True)
class _Layout:
    """Where a message class's fields travel: the header fields and their types, then the frame fields."""

    header: tuple[tuple[str, object], ...]
    frames: tuple[str, ...]
    custom: bool  # the class packs itself (to_wire / from_wire)


@cache
def _layout(cls: type) -> _Layout:
    if hasattr(cls, "to_wire"):
        if type(getattr(cls, "FRAMES", None)) is not int or not hasattr(cls, "from_wire"):
            raise TypeError(f"{cls.__name__} packs itself: it needs FRAMES, to_wire and from_wire")
        return _Layout((), (), custom=True)
    fields = field_types(cls)
    return _Layout(header=tuple((n, kind) for n, kind in fields if kind != TokenFrame),
                   frames=tuple(n for n, kind in fields if kind == TokenFrame), custom=False)


def register(cls: type) -> type:
    """Class decorator: make dataclass ``cls`` (with ``TYPE``) encodable and decodable; sets ``FRAMES``."""
    if cls.TYPE in _REGISTRY:
        raise ValueError(f"wire message type {cls.TYPE!r} is registered twice")
    layout = _layout(cls)
    if not layout.custom:
        cls.FRAMES = len(layout.frames)
    _REGISTRY[cls.TYPE] = cls
    return cls


def encode(msg: object) -> list[bytes]:
    """The frames of ``msg``: header first, then its array frames."""
    cls = type(msg)
    if _REGISTRY.get(getattr(cls, "TYPE", None)) is not cls:
        raise WireError(f"{cls.__name__} is not a wire message")
    layout = _layout(cls)
    if layout.custom:
        fields, frames = msg.to_wire()
    else:
        fields = {n: to_json(getattr(msg, n)) for n, _ in layout.header}
        frames = [tokens_to_frame(getattr(msg, n)) for n in layout.frames]
    return [orjson.dumps({"type": cls.TYPE, "v": PROTOCOL_VERSION, **fields}), *frames]


def decode(frames: object, accept: tuple[type, ...] | None = None) -> object:
    """Decode one multipart message; ``accept`` limits the types allowed here.

    Raises ``WireError`` with a clear message for anything malformed.
    """
    header = _read_header(frames)
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
    fields = {k: v for k, v in header.items() if k != "type" and k != "v"}
    try:
        return _build(cls, fields, list(frames[1:]))
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(f"bad {type_name} message: {e}") from None


def _read_header(frames: object) -> dict:
    """Frame 0 as a JSON object, after checking that ``frames`` is a list of byte frames."""
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
    return header


def _build(cls: type, fields: dict, frames: list) -> object:
    layout = _layout(cls)
    if layout.custom:
        return cls.from_wire(fields, frames)
    check_field_names(fields, (n for n, _ in layout.header))
    values = {n: from_json(kind, fields[n], n) for n, kind in layout.header}
    for n, frame in zip(layout.frames, frames):
        values[n] = frame_to_tokens(n, frame)
    return cls(**values)
