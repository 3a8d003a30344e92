"""Retained entries and the slots their state images live in.

An entry keeps a prefix resumable with no request holding it::

    tokens   : the prefix (n tokens)
    pages    : a SequencePages owner in the KV pool; full pages shared in place
               with whoever else holds them, the partial last page a private copy
    slot     : one retained slot holding the state image at position n
               (recurrent + conv state of every linear layer)

Slots are reserved at load, in two places: ``--reuse-device-slots`` on the
device and ``--reuse-host-slots-per-lane`` x lanes in one host block. Slot
ids are global: ``0 .. D-1`` are device slots, ``D ..`` host slots. Device
slots are handed out first (a device copy is far cheaper than a PCIe one).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ignis.engine.sequence_pages import SequencePages

KINDS = ("retained_prefix", "prompt_checkpoint", "part_boundary", "learned_point", "aborted_prefill")
"""retained_prefix: end of system + tools; prompt_checkpoint: the generation opener; part_boundary: before the
final text part of the newest multi-part user message; learned_point: where two served prompts diverged;
aborted_prefill: how far a prefill had come when its request was aborted (``prefill_chunks.capture_aborted``)."""


@dataclass(eq=False)
class Entry:
    entry_id: int
    tokens: tuple[int, ...]
    full_hash: bytes  # chain hash of the entry's full pages
    pages: SequencePages
    slot: int
    kind: str  # one of KINDS
    request_class: str
    after_user: bool  # a checkpoint made right after a real user message
    last_used: int
    parent: "Entry | None" = field(default=None, repr=False)  # the conversation's previous checkpoint
    pinned: bool = False  # bytes move this round: not reclaimable until the round is applied
    filled: bool = True  # a capture's slot holds its image only once the round that took it is applied
    stamp: str = ""  # artifact structural hash, KV format, drafter presence
    used_at: float = 0.0  # wall clock (unix s) of its capture or last hit: tierd's TTL counts from it
    restored_from: str | None = None  # "ram" / "disk": restored from there and not hit since
    family: str | None = None  # the cache family of the request that made it (Request.cache_family)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def full_pages(self) -> int:
        return len(self.tokens) // self.pages.pool.page_tokens

    @property
    def tail(self) -> tuple[int, ...]:
        return self.tokens[self.full_pages * self.pages.pool.page_tokens:]


class SlotPool:
    """Free retained slots, lowest id first (device slots before host slots)."""

    def __init__(self, device_slots: int, host_slots: int):
        if device_slots < 0 or host_slots < 0:
            raise ValueError("slot counts must be >= 0")
        self.device_slots = device_slots
        self.host_slots = host_slots
        self._free = list(range(device_slots + host_slots))
        heapq.heapify(self._free)

    @property
    def total(self) -> int:
        return self.device_slots + self.host_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def tier_of(self, slot: int) -> str:
        if not 0 <= slot < self.total:
            raise ValueError(f"slot {slot} out of range 0..{self.total - 1}")
        return "device" if slot < self.device_slots else "host"

    def take(self, host_only: bool = False) -> int | None:
        """The lowest free slot (``host_only``: the lowest free host slot), or None."""
        if not host_only:
            return heapq.heappop(self._free) if self._free else None
        host = [s for s in self._free if s >= self.device_slots]
        if not host:
            return None
        slot = min(host)
        self._free.remove(slot)
        heapq.heapify(self._free)
        return slot

    def give_back(self, slot: int) -> None:
        self.tier_of(slot)
        if slot in self._free:
            raise ValueError(f"slot {slot} is already free")
        heapq.heappush(self._free, slot)
