"""The state machine of one entry's place in a tier, and the entry record tierd keeps per key.

Every entry has one ``Slot`` per tier (KV-RAM arena and KV-disk). A slot
moves only along these edges; anything else raises ``IllegalTransition``::

    FREE ──prepare──> RESERVED ──copy starts──> FILLING ──copy done──> RESIDENT
      ^                  │                         │                   │  ^  │
      │                  └── cancel ──> FREE       └── copy failed ──> FREE  │
      │                                                  restore starts │  │ restore done
      │                                                                 v  │
      │                                                                READING
      │
      ├──── drop / discard ──────────────────────────────────── RESIDENT
      └──── spill done ──── SPILLING <── spill starts ───────── RESIDENT
                               └── spill failed ──> RESIDENT

An arena slot uses every edge; a disk slot never spills (KV-disk is the last
tier). A spill moves an entry down: its arena slot goes RESIDENT -> SPILLING
while its disk slot goes FREE -> RESERVED -> FILLING; when the file is complete
the disk slot is RESIDENT and the arena slot FREE. Invariant: an idle entry
(no slot busy) is resident in exactly one tier.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SlotState(enum.Enum):
    FREE = "free"
    RESERVED = "reserved"  # room promised, no byte written yet
    FILLING = "filling"  # a copy into this tier is in flight
    RESIDENT = "resident"  # holds the entry's bytes, nothing in flight
    READING = "reading"  # a restore is copying out of this tier
    SPILLING = "spilling"  # a copy down to the next tier is in flight; the bytes are still here


S = SlotState
TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    S.FREE: frozenset({S.RESERVED}),
    S.RESERVED: frozenset({S.FILLING, S.FREE}),
    S.FILLING: frozenset({S.RESIDENT, S.FREE}),
    S.RESIDENT: frozenset({S.READING, S.SPILLING, S.FREE}),
    S.READING: frozenset({S.RESIDENT}),
    S.SPILLING: frozenset({S.FREE, S.RESIDENT}),
}
BUSY = frozenset({S.RESERVED, S.FILLING, S.READING, S.SPILLING})
HOLDS_BYTES = frozenset({S.RESIDENT, S.READING, S.SPILLING})


class IllegalTransition(RuntimeError):
    """A slot was asked to move along an edge the state machine does not have (a bookkeeping bug)."""


class Slot:
    """One entry's place in one tier ("ram" or "disk")."""

    __slots__ = ("tier", "state")

    def __init__(self, tier: str):
        if tier not in ("ram", "disk"):
            raise ValueError(f"a slot lives in tier 'ram' or 'disk', not {tier!r}")
        self.tier = tier
        self.state = SlotState.FREE

    def move(self, to: SlotState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.tier} slot cannot go {self.state.name} -> {to.name}")
        if self.tier == "disk" and to is S.SPILLING:
            raise IllegalTransition("a disk slot cannot spill: KV-disk is the last tier")
        self.state = to

    @property
    def busy(self) -> bool:
        return self.state in BUSY

    @property
    def holds_bytes(self) -> bool:
        return self.state in HOLDS_BYTES

    def __repr__(self) -> str:
        return f"Slot({self.tier}, {self.state.name})"


@dataclass
class Entry:
    """What tierd knows about one key.

    ``shape`` is the block name of every ref, in order: a restore must name the
    same blocks in the same order. ``blocks`` are the arena block indices that
    hold the payload while the arena slot holds bytes (payload byte p lives in
    ``blocks[p // block_bytes]`` at offset ``p % block_bytes``). ``header`` is
    its KV-disk file header and ``file_bytes`` the size of that file (header +
    payload + checksums), reserved under the ceiling while the disk slot is
    not FREE. ``waiting`` holds requests on this key that came while it was
    busy; they are handled again, in order, once it is idle or gone.
    """

    key: str
    shape: tuple[str, ...]
    nbytes: int
    kind: str
    request_class: str
    last_used: float
    seq: int
    arena: Slot = field(default_factory=lambda: Slot("ram"))
    disk: Slot = field(default_factory=lambda: Slot("disk"))
    blocks: list[int] = field(default_factory=list)
    header: bytes = b""
    file_bytes: int = 0
    pending: bool = True  # accepted, waiting for its first copy to finish
    waiting: list = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return self.pending or self.arena.busy or self.disk.busy

    @property
    def tier(self) -> str | None:
        """Where a restore would read from now (None while nothing complete is held)."""
        if self.arena.holds_bytes:
            return "ram"
        if self.disk.holds_bytes:
            return "disk"
        return None

    @property
    def idle_in(self) -> str | None:
        """The tier an idle entry rests in (None while busy)."""
        if self.busy:
            return None
        return self.tier
