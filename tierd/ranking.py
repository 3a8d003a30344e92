"""Ranking and room planning: which entries give way, and how, when a tier needs room. Pure Python.

Rank (lowest is evicted first), compared as a tuple::

    (kind, class, last_used, seq)
     │     │      │          └ arrival order: ties go to the older entry
     │     │      └ least recently used first
     │     └ agent (0) below interactive (1); a retained interactive entry idle
     │       longer than the TTL ranks as an agent's
     └ retained (0) always below live (1)

Rules (DESIGN §5):
- A tier makes room only by moving entries that rank strictly below the
  incoming one; otherwise the incoming entry is the one that goes down
  (target "auto") or is refused.
- In the arena a victim is spilled to KV-disk when disk is on and has (or
  can make) room for it; a retained victim that cannot be spilled is
  discarded; a live victim that cannot be spilled is left alone.
- KV-disk is the last tier: it makes room only by discarding retained
  entries. tierd never discards a live entry, with disk on or off (only the
  engine's ``drop`` removes one), so a live demote into tiers full of live
  work is refused.
- A plan is computed whole before anything is touched: if it cannot cover
  the need, nothing is discarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rank:
    kind: str  # "retained" | "live"
    request_class: str  # "interactive" | "agent"
    last_used: float  # unix seconds
    seq: int  # tierd's arrival counter


def rank_key(rank: Rank, now: float, ttl: float) -> tuple[int, int, float, int]:
    """The sort key of ``rank`` at time ``now`` (see the module docstring)."""
    kind = 0 if rank.kind == "retained" else 1
    cls = 0 if rank.request_class == "agent" else 1
    if kind == 0 and cls == 1 and now - rank.last_used > ttl:
        cls = 0
    return (kind, cls, rank.last_used, rank.seq)


@dataclass(frozen=True)
class Candidate:
    """An idle entry that could give way: ``size`` in the tier's unit (arena blocks or disk bytes).

    ``file_bytes`` is what it would take on KV-disk if spilled (arena candidates).
    """

    key: str
    rank: Rank
    size: int
    file_bytes: int = 0

    @property
    def live(self) -> bool:
        return self.rank.kind == "live"


def eviction_order(cands: Iterable[Candidate], now: float, ttl: float) -> list[Candidate]:
    """``cands`` lowest rank first: the order in which they give way."""
    return sorted(cands, key=lambda c: rank_key(c.rank, now, ttl))


@dataclass(frozen=True)
class DiskView:
    """What room planning needs to know about KV-disk (None in a plan = disk off)."""

    free: int  # bytes under the ceiling, reservations counted as used
    cands: tuple[Candidate, ...]  # idle entries resting on disk


@dataclass
class RoomPlan:
    """What to do, in order: discard ``disk_discards``, discard ``arena_discards``, spill ``spills``."""

    spills: list[str] = field(default_factory=list)
    arena_discards: list[str] = field(default_factory=list)
    disk_discards: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.spills or self.arena_discards or self.disk_discards)


def _disk_room(free: int, need: int, above: tuple, ordered: Sequence[Candidate], taken: set[str],
               now: float, ttl: float) -> tuple[list[str], int] | None:
    """Retained disk entries ranked below ``above`` to discard so ``need`` bytes fit; None if they cannot."""
    chosen: list[str] = []
    for c in ordered:
        if free >= need:
            break
        if c.key in taken or c.live or rank_key(c.rank, now, ttl) >= above:
            continue
        chosen.append(c.key)
        free += c.size
    if free < need:
        return None
    return chosen, free - need


def plan_disk_room(disk: DiskView, need_bytes: int, incoming: Rank, now: float, ttl: float) -> RoomPlan | None:
    """Room for ``need_bytes`` on KV-disk for ``incoming``; None when it cannot be made."""
    ordered = eviction_order(disk.cands, now, ttl)
    got = _disk_room(disk.free, need_bytes, rank_key(incoming, now, ttl), ordered, set(), now, ttl)
    if got is None:
        return None
    return RoomPlan(disk_discards=got[0])


def plan_arena_room(free_blocks: int, need_blocks: int, incoming: Rank, arena_cands: Iterable[Candidate],
                    disk: DiskView | None, now: float, ttl: float) -> RoomPlan | None:
    """Room for ``need_blocks`` arena blocks for ``incoming``; None when it cannot be made.

    Victims are taken lowest rank first and only below ``incoming``; each is
    spilled if KV-disk can take it, else discarded if retained, else skipped.
    """
    plan = RoomPlan()
    if free_blocks >= need_blocks:
        return plan
    above = rank_key(incoming, now, ttl)
    disk_free = disk.free if disk is not None else 0
    disk_ordered = eviction_order(disk.cands, now, ttl) if disk is not None else []
    taken: set[str] = set()
    for c in eviction_order(arena_cands, now, ttl):
        if free_blocks >= need_blocks:
            break
        victim = rank_key(c.rank, now, ttl)
        if victim >= above:
            break  # everything after ranks higher still
        got = None
        if disk is not None:
            got = _disk_room(disk_free, c.file_bytes, victim, disk_ordered, taken, now, ttl)
        if got is not None:
            discards, disk_free = got
            taken.update(discards)
            plan.disk_discards.extend(discards)
            plan.spills.append(c.key)
        elif not c.live:
            plan.arena_discards.append(c.key)
        else:
            continue
        free_blocks += c.size
    if free_blocks < need_blocks:
        return None
    return plan
