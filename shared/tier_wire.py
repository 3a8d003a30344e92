"""The engine <-> tierd wire protocol: typed request/reply messages over DEALER/ROUTER.

A protocol of its own (``ENGINE_TIERD``: version, message types) on the one
codec (``shared.wire_codec``): an orjson header with ``type``, ``v`` and every
field, no array frames, no pickle. Every
request carries ``req`` (the engine's number for it) and every reply echoes
it, so replies that finish out of order (a restore from disk after a demote
to RAM) are matched without guessing.

Two-phase and keyed by content: ``key`` is the engine's content hash (hex).
A ``Demote`` is answered ``Demoted`` only once the copy out of engine memory
is complete; a ``Restore`` is answered ``Restored`` only once the copy into it
is complete. Until then the engine must not reuse the pages or slots named.

    engine -> tierd   Hello, Demote, Restore, Drop, Lookup, Stats, Bye
    tierd -> engine   Welcome, Demoted, Restored, Missing, Dropped, LookupReply,
                      TierRefused, StatsReply, Detached, ErrorReply (undecodable input)

A memory reference (``Ref``) is ``(block, item)``: item ``item`` of the
exported block named ``block``; blocks, items and keys are described in
``shared.tier_layout``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from ignis.shared.tier_layout import MAX_BLOCKS, BlockDesc, UnitLayout, check_key, check_refs
from ignis.shared.wire import REQUEST_CLASSES, Stats, StatsReply
from ignis.shared.wire_codec import ErrorReply, WireProtocol
from ignis.shared.wire_fields import (
    MAX_INT,
    MAX_TEXT_CHARS,
    WireError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
)

__all__ = [
    "TIER_PROTOCOL_VERSION", "BlockDesc", "UnitLayout", "Hello", "Demote", "Restore", "Drop", "Lookup", "Bye",
    "Welcome", "Detached", "Demoted", "Restored", "Missing", "Dropped", "LookupReply", "TierRefused", "Stats",
    "StatsReply", "ErrorReply", "ENGINE_TO_TIERD", "TIERD_TO_ENGINE", "ENGINE_TIERD", "WireError", "encode",
    "decode",
]

ENGINE_TIERD = WireProtocol("engine-tierd", version=1)
"""Header ``v`` stays 1; the contract's version travels in ``Hello`` instead (``TIER_PROTOCOL_VERSION``),
so a tierd of another version that can read the Hello refuses it in words (TierRefused, reason "protocol")."""
ENGINE_TIERD.add(Stats, StatsReply)

TIER_PROTOCOL_VERSION = 4
"""Version of the engine <-> tierd contract; checked at ``Hello``, bumped on any incompatible change."""

FAMILIES = ("qwen3_5", "qwen3_next")
TARGETS = ("ram", "disk", "auto")
TIERS = ("ram", "disk")
KINDS = ("retained", "live")
CLASSES = REQUEST_CLASSES
OPS = ("hello", "demote", "restore", "drop", "lookup", "bye")
REFUSAL_REASONS = ("protocol", "busy", "bad_layout", "not_ready", "stamp", "bad_request", "no_room", "no_disk",
                   "copy_failed")
MISSING_REASONS = ("unknown", "corrupt", "io_error")

MAX_STAMP_CHARS = 512
MAX_ENGINE_ID_CHARS = 256
MAX_KEYS = 1 << 16
MAX_LAST_USED = 1e11  # unix seconds, year ~5138


def _check_stamp(value: object) -> str:
    return check_str("stamp", value, MAX_STAMP_CHARS, allow_empty=False)


def _check_req(value: object) -> int:
    return check_int("req", value, 0, MAX_INT)


# ----- engine -> tierd ------------------------------------------------------


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Hello:
    """First message: the engine's exported blocks, its entry layout, stamp and family.

    ``block_bytes`` is the arena's allocation unit (the engine sends its page
    bytes). ``engine_id`` names the engine (its instance): tierd serves one.
    A Hello from the attached connection starts a new session (every entry is
    dropped); one from another connection with the same ``engine_id``, stamp,
    family and block size is that engine restarted: the arena stays mapped and
    the entries are dropped (the new process has no record of their tokens to
    find them by). The same ``engine_id`` with another stamp, family or block
    size starts a new session; another ``engine_id`` while one is attached is
    refused (reason "busy") and changes nothing.
    """

    TYPE: ClassVar[str] = "tier_hello"

    req: int
    protocol: int
    stamp: str
    family: str
    block_bytes: int
    blocks: tuple[BlockDesc, ...]
    unit: UnitLayout
    engine_id: str = "default"

    def __post_init__(self):
        _check_req(self.req)
        check_int("protocol", self.protocol, 0, MAX_INT)
        _check_stamp(self.stamp)
        check_str("engine_id", self.engine_id, MAX_ENGINE_ID_CHARS, allow_empty=False)
        check_choice("family", self.family, FAMILIES)
        check_int("block_bytes", self.block_bytes, 4096, 1 << 34)
        blocks = tuple(self.blocks) if isinstance(self.blocks, (list, tuple)) else self.blocks
        if type(blocks) is not tuple or not 1 <= len(blocks) <= MAX_BLOCKS:
            raise ValueError(f"blocks must be a list of 1-{MAX_BLOCKS} block descriptors")
        if not all(isinstance(b, BlockDesc) for b in blocks):
            raise TypeError("blocks must hold BlockDesc values")
        object.__setattr__(self, "blocks", blocks)
        names = [b.name for b in blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"block names repeat: {names}")
        if not isinstance(self.unit, UnitLayout):
            raise TypeError("unit must be a UnitLayout")
        for n in (self.unit.pages, *self.unit.lane, self.unit.image):
            if n is not None and n not in names:
                raise ValueError(f"unit layout names block {n!r}, which is not among the blocks {names}")

    def block(self, name: str) -> BlockDesc:
        return next(b for b in self.blocks if b.name == name)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Demote:
    """Prepare: copy ``source`` out of engine memory into ``target`` under ``key``.

    Ranking: ``kind`` (retained entries always go first), ``request_class``
    (agent below interactive) and ``last_used`` (unix seconds; older goes first).
    """

    TYPE: ClassVar[str] = "tier_demote"

    req: int
    key: str
    stamp: str
    source: tuple[tuple[str, int], ...]
    target: str = "auto"
    kind: str = "retained"
    request_class: str = "interactive"
    last_used: float = 0.0

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)
        _check_stamp(self.stamp)
        object.__setattr__(self, "source", check_refs("source", self.source))
        check_choice("target", self.target, TARGETS)
        check_choice("kind", self.kind, KINDS)
        check_choice("request_class", self.request_class, CLASSES)
        object.__setattr__(self, "last_used", check_float("last_used", self.last_used, 0.0, MAX_LAST_USED))


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Restore:
    """Copy entry ``key`` into ``dest`` (same blocks, in the same order, as its source), all but its
    first ``skip`` page items: the engine shares those pages from a device entry it holds already,
    so ``dest`` names the source's items from ``skip`` on."""

    TYPE: ClassVar[str] = "tier_restore"

    req: int
    key: str
    stamp: str
    dest: tuple[tuple[str, int], ...]
    skip: int = 0

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)
        _check_stamp(self.stamp)
        object.__setattr__(self, "dest", check_refs("dest", self.dest))
        check_int("skip", self.skip, 0, MAX_INT)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Drop:
    """Forget entry ``key`` in every tier."""

    TYPE: ClassVar[str] = "tier_drop"

    req: int
    key: str

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Lookup:
    """Which of ``keys`` are held, and where. Listed longest first: the first held in each tier is the
    one a restore would take, and tierd ranks it as used now."""

    TYPE: ClassVar[str] = "tier_lookup"

    req: int
    stamp: str
    keys: tuple[str, ...]

    def __post_init__(self):
        _check_req(self.req)
        _check_stamp(self.stamp)
        if not isinstance(self.keys, (list, tuple)) or len(self.keys) > MAX_KEYS:
            raise ValueError(f"keys must be a list of at most {MAX_KEYS} keys")
        object.__setattr__(self, "keys", tuple(check_key(k, f"keys[{i}]") for i, k in enumerate(self.keys)))


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Bye:
    """The engine detaches for good: tierd drops every entry it held for it and gives the engine's memory
    back (answered ``Detached``).

    An engine that stops to restart sends nothing: its next Hello finds the
    arena still mapped (``Hello``)."""

    TYPE: ClassVar[str] = "tier_bye"

    req: int

    def __post_init__(self):
        _check_req(self.req)


# ----- tierd -> engine ------------------------------------------------------


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Welcome:
    """Hello accepted: the arena and KV-disk this tierd offers (``disk_bytes`` 0 = KV-disk off)."""

    TYPE: ClassVar[str] = "tier_welcome"

    req: int
    protocol: int
    arena_bytes: int
    arena_blocks: int
    block_bytes: int
    locked_bytes: int
    disk_bytes: int

    def __post_init__(self):
        _check_req(self.req)
        for f in fields(self):
            if f.name != "req":
                check_int(f.name, getattr(self, f.name), 0, MAX_INT)


def _check_tier(value: object) -> str:
    return check_choice("tier", value, TIERS)


@dataclass(frozen=True)
class _CopyDone:
    """A copy is complete: ``key`` in ``tier``, ``nbytes`` of payload (the two answers differ by type only)."""

    req: int
    key: str
    tier: str
    nbytes: int

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)
        _check_tier(self.tier)
        check_int("nbytes", self.nbytes, 0, MAX_INT)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Demoted(_CopyDone):
    """The copy out of engine memory is complete: ``key`` is held in ``tier``."""

    TYPE: ClassVar[str] = "tier_demoted"


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Restored(_CopyDone):
    """The copy into engine memory is complete (read from ``tier``)."""

    TYPE: ClassVar[str] = "tier_restored"


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Missing:
    """A restore found nothing usable: never held or dropped ("unknown"), or a bad KV-disk file."""

    TYPE: ClassVar[str] = "tier_missing"

    req: int
    key: str
    reason: str
    message: str

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)
        check_choice("reason", self.reason, MISSING_REASONS)
        check_str("message", self.message, MAX_TEXT_CHARS)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Dropped:
    """``key`` is gone from every tier; ``held`` says whether it was there."""

    TYPE: ClassVar[str] = "tier_dropped"

    req: int
    key: str
    held: bool

    def __post_init__(self):
        _check_req(self.req)
        check_key(self.key)
        check_bool("held", self.held)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class LookupReply:
    """Parallel to the Lookup's keys: the tier holding each (None: not held) and its payload bytes."""

    TYPE: ClassVar[str] = "tier_lookup_reply"

    req: int
    keys: tuple[str, ...]
    tiers: tuple[str | None, ...]
    nbytes: tuple[int, ...]

    def __post_init__(self):
        _check_req(self.req)
        lists = []
        for name in ("keys", "tiers", "nbytes"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or len(value) > MAX_KEYS:
                raise ValueError(f"{name} must be a list of at most {MAX_KEYS} values")
            lists.append(tuple(value))
        keys, tiers, nbytes = lists
        if not len(keys) == len(tiers) == len(nbytes):
            raise ValueError("keys, tiers and nbytes must be parallel lists")
        for i, (k, t, n) in enumerate(zip(keys, tiers, nbytes)):
            check_key(k, f"keys[{i}]")
            if t is not None:
                _check_tier(t)
            check_int(f"nbytes[{i}]", n, 0, MAX_INT)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "tiers", tiers)
        object.__setattr__(self, "nbytes", nbytes)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class TierRefused:
    """Request ``op`` (on ``key``; "" for hello and lookup) was not done; no byte moved."""

    TYPE: ClassVar[str] = "tier_refused"

    req: int
    op: str
    key: str
    reason: str
    message: str

    def __post_init__(self):
        _check_req(self.req)
        check_choice("op", self.op, OPS)
        if self.key != "":
            check_key(self.key)
        check_choice("reason", self.reason, REFUSAL_REASONS)
        check_str("message", self.message, MAX_TEXT_CHARS)


@ENGINE_TIERD.message
@dataclass(frozen=True)
class Detached:
    """The answer to ``Bye``: the session is over and ``entries`` entries were dropped."""

    TYPE: ClassVar[str] = "tier_detached"

    req: int
    entries: int

    def __post_init__(self):
        _check_req(self.req)
        check_int("entries", self.entries, 0, MAX_INT)


ENGINE_TO_TIERD = (Hello, Demote, Restore, Drop, Lookup, Bye, Stats)
TIERD_TO_ENGINE = (Welcome, Demoted, Restored, Missing, Dropped, LookupReply, Detached, TierRefused, StatsReply,
                   ErrorReply)

encode = ENGINE_TIERD.encode
decode = ENGINE_TIERD.decode
