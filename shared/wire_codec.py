"""The one wire codec: typed dataclass messages as ZeroMQ multipart frames, for every protocol.

    frame 0    orjson header {"type": <TYPE>, "v": <protocol's version>, <field>: <JSON value>, ...}
    frame 1..  one raw little-endian int32 frame per ``TokenFrame`` field, in field order
               (``shared.wire_fields``)
    then       one raw RGB frame per image of an ``ImageFrames`` field (at most one such field,
               listed in the header only when it holds images; ``shared.wire_images``)

A message is a frozen dataclass with a ``TYPE`` name. By default its fields
travel in the header in declaration order, each as ``shared.wire_values``
maps its declared type to JSON and back (strictly), except ``TokenFrame``
fields, which travel as frames. Every field is in every header: none may be
left out, none added, except the names a class lists in ``OPTIONAL`` (fields
defaulting to None): those travel only when set, and a header without one
means None, so a peer that predates the field still understands the message. A class whose layout is not one value per field
(``TokenBatch``: columns plus one frame for all streams) defines ``FRAMES``,
``to_wire() -> (fields, frames)`` and ``from_wire(fields, frames)`` instead.

A ``WireProtocol`` is one conversation (gateway <-> engine in
``shared.wire``, engine <-> tierd in ``shared.tier_wire``): its version and
its message types. ``decode`` raises ``WireError`` and nothing else, whatever
it is given. No pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import orjson

from ignis.shared.wire_fields import (
    MAX_TEXT_CHARS,
    TokenFrame,
    WireError,
    check_str,
    frame_to_tokens,
    tokens_to_frame,
)
from ignis.shared.wire_images import ImageFrames, images_from_wire, images_to_wire
from ignis.shared.wire_values import check_field_names, field_types, from_json, to_json

MAX_HEADER_BYTES = 16 << 20


@dataclass(frozen=True)
class ErrorReply:
    """Answer to input that could not be decoded at all (no request id is trusted); in every protocol."""

    TYPE: ClassVar[str] = "error"

    message: str

    def __post_init__(self):
        check_str("message", self.message, MAX_TEXT_CHARS)


class WireProtocol:
    """One conversation's version and message types, and ``encode``/``decode`` for them.

    ``version`` is stamped as ``v`` in every header and checked first on every
    message: a peer speaking another version is refused. Type names are unique
    within a protocol; a class may belong to several (``ErrorReply``, the
    answer to garbage, belongs to every one).
    """

    def __init__(self, name: str, version: int):
        self.name = name
        self.version = version
        self._types: dict[str, type] = {}
        _PROTOCOLS.append(self)
        self.add(ErrorReply)

    def add(self, *classes: type) -> None:
        """Make dataclasses ``classes`` (each with a ``TYPE``) messages of this protocol; sets ``FRAMES``."""
        for cls in classes:
            if self._types.get(cls.TYPE, cls) is not cls:
                raise ValueError(f"{self.name}: message type {cls.TYPE!r} is registered twice")
            layout = _layout(cls)
            if not layout.custom:
                cls.FRAMES = len(layout.frames)
            self._types[cls.TYPE] = cls

    def message(self, cls: type) -> type:
        """Class decorator: ``add(cls)``."""
        self.add(cls)
        return cls

    def speaks(self, cls: type) -> bool:
        return self._types.get(getattr(cls, "TYPE", None)) is cls

    def encode(self, msg: object) -> list[bytes]:
        """The frames of ``msg``: header first, then its array frames."""
        cls = type(msg)
        if not self.speaks(cls):
            raise WireError(f"{cls.__name__} is not a wire message of the {self.name} protocol")
        layout = _layout(cls)
        if layout.custom:
            fields, frames = msg.to_wire()
        else:
            fields = {n: to_json(getattr(msg, n)) for n, _ in layout.header
                      if n not in layout.optional or getattr(msg, n) is not None}
            frames = [tokens_to_frame(getattr(msg, n)) for n in layout.frames]
            if layout.images is not None and getattr(msg, layout.images):
                fields[layout.images], pictures = images_to_wire(getattr(msg, layout.images))
                frames.extend(pictures)
        return [orjson.dumps({"type": cls.TYPE, "v": self.version, **fields}), *frames]

    def decode(self, frames: object, accept: tuple[type, ...] | None = None,
               readers: Mapping[type, Callable[[dict, list], object]] | None = None) -> object:
        """Decode one multipart message; ``accept`` limits the types allowed here; ``readers`` builds the
        types it names its own way, ``reader(fields, frames)``, with the same checks (``shared.wire``'s
        ``TOKEN_COLUMNS`` reads a TokenBatch as columns).

        Raises ``WireError`` with a clear message for anything malformed.
        """
        header = _read_header(frames)
        version = header.get("v")
        if version != self.version or type(version) is not int:
            raise WireError(f"protocol version {version!r}, this side speaks {self.version}")
        type_name = header.get("type")
        cls = self._types.get(type_name) if type(type_name) is str else None
        if cls is None:
            raise WireError(f"unknown message type {type_name!r}")
        if accept is not None and cls not in accept:
            raise WireError(f"message type {type_name!r} is not accepted on this socket")
        expected = 1 + cls.FRAMES + _image_frames(cls, header)
        if len(frames) != expected:
            raise WireError(f"{type_name} message has {len(frames)} frames, expected {expected}")
        fields = {k: v for k, v in header.items() if k != "type" and k != "v"}
        try:
            reader = readers.get(cls) if readers is not None else None
            if reader is not None:
                return reader(fields, list(frames[1:]))
            return _build(cls, fields, list(frames[1:]))
        except WireError:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            raise WireError(f"bad {type_name} message: {e}") from None

    def __repr__(self) -> str:
        return f"WireProtocol({self.name!r}, version={self.version})"


_PROTOCOLS: list[WireProtocol] = []


def protocol_of(classes: tuple[type, ...]) -> WireProtocol:
    """The one protocol that has every class in ``classes`` (a channel's accepted types)."""
    found = [p for p in _PROTOCOLS if all(p.speaks(cls) for cls in classes)]
    if len(found) != 1:
        names = ", ".join(getattr(cls, "__name__", repr(cls)) for cls in classes)
        raise ValueError(f"{names} are messages of {len(found)} protocols {found}, not of exactly one")
    return found[0]


@dataclass(frozen=True)
class _Layout:
    """Where a message class's fields travel: the header fields with their types, then the frame fields."""

    header: tuple[tuple[str, object], ...]
    frames: tuple[str, ...]
    custom: bool  # the class packs itself (to_wire / from_wire); header and frames are empty
    optional: frozenset[str] = frozenset()  # header fields sent only when not None
    images: str | None = None  # the ImageFrames field: its entries in the header, its frames last


@cache
def _layout(cls: type) -> _Layout:
    if hasattr(cls, "to_wire"):
        if type(getattr(cls, "FRAMES", None)) is not int or not hasattr(cls, "from_wire"):
            raise TypeError(f"{cls.__name__} packs itself: it needs FRAMES, to_wire and from_wire")
        return _Layout((), (), custom=True)
    fields = field_types(cls)
    optional = frozenset(getattr(cls, "OPTIONAL", ()))
    header = tuple((n, kind) for n, kind in fields if kind != TokenFrame and kind != ImageFrames)
    if not optional <= {n for n, _ in header}:
        raise TypeError(f"{cls.__name__}.OPTIONAL names fields that are not header fields")
    images = [n for n, kind in fields if kind == ImageFrames]
    if len(images) > 1:
        raise TypeError(f"{cls.__name__} has more than one ImageFrames field")
    return _Layout(header=header, frames=tuple(n for n, kind in fields if kind == TokenFrame), custom=False,
                   optional=optional, images=images[0] if images else None)


def _image_frames(cls: type, header: dict) -> int:
    """How many image frames a message of ``cls`` with ``header`` claims to carry (0 if its entries are bad:
    the frame count is then checked against none, and the entries are refused when read)."""
    layout = _layout(cls)
    entries = header.get(layout.images) if layout.images is not None else None
    return len(entries) if type(entries) is list else 0


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
    images = (layout.images,) if layout.images is not None else ()
    check_field_names(fields, (n for n, _ in layout.header if n not in layout.optional), (*layout.optional, *images))
    values = {n: from_json(kind, fields[n], n) for n, kind in layout.header if n in fields}
    for n, frame in zip(layout.frames, frames):
        values[n] = frame_to_tokens(n, frame)
    if layout.images is not None and layout.images in fields:
        if not fields[layout.images]:
            raise WireError(f"{layout.images} is sent only when it holds images")
        values[layout.images] = images_from_wire(layout.images, fields[layout.images], frames[len(layout.frames):])
    return cls(**values)
