"""The retained store: content-addressed index, captures, lookups, ranking and release.

Invariants:

- An entry is found only by content: ``lookup`` hashes the prompt's full
  pages, takes the entries filed under the longest matching chain hash, and
  verifies every candidate token by token before returning it.
- Reuse copies and never consumes: a lookup leaves the entry in place.
- One entry per token sequence: a capture of tokens already retained is
  skipped (and refreshes the entry's recency).
- Retained pages never delay or refuse an admission: ``reclaim_pages``
  releases entries, lowest-ranked first, until the pool has the room.
- Rank (lowest goes first): made by an agent request below interactive, then
  least recently used; a retained prefix that queued requests wait to read
  ranks as interactive whoever made it (``engine.prefill_chunks``); the
  arrival of a request whose client named a cache family (``prompt_cache_key``)
  counts as a use of every entry that family made (``touch_family``). A capture
  may only take the slot of an entry ranked no higher than itself; if none
  qualifies the capture is skipped.
- A conversation (checkpoints whose tokens extend each other) keeps at most
  two checkpoints: its latest, and the nearest earlier one made right after a
  real user message (released only once no round still reads it).
- Entries pinned this round (being filled or read) are never released.
- A captured entry is *pending* until the round whose forward fills its slot
  has been applied (``mark_filled``): ``lookup`` never returns it before then,
  so no request resumes from a slot that holds nothing yet. A request whose
  prompt a pending entry covers further than any filled one waits a round for
  it (``pending_prefix``) instead of prefilling the same block again.
- Every entry carries the stamp it was made under (artifact structural hash,
  KV format, drafter presence); an entry whose stamp differs from the store's
  current one is refused before any byte moves.
- The lower tiers are reached only through the ``TierPort`` given at
  construction (``NO_TIERS`` when there are none): an entry moves down only
  when the device needs its room, and comes back only past its tier's restore
  floor. Every exchange is posted, never awaited (``engine.reuse.lower_moves``):
  a demote holds its pages and slot until it lands, a restore fills reserved
  pages and a slot that no page table names, and the request waiting for it
  resumes the round it lands (``pending_prefix`` covers it meanwhile). The
  records of what tierd holds (``lower``) are of the port's current session:
  after a new hello they are empty before anything reads them.
- A restored entry is registered only once ``TierPort.check_restored`` accepts
  its bytes (finite KV rows and image); a rejected one is dropped here and
  below, and the lookup falls back to the device match (or none).
- A demote carries the wall-clock time of the entry's capture or last hit
  (``Entry.used_at``), not of the demotion: tierd's interactive TTL counts
  from the last use.
- Every entry registered on the device, released from it, or known below
  is told to the ``blocks`` ledger (``engine.reuse.block_events``: KV events
  for cache-aware routers; a no-op unless they are on).
- What happened to a capture that is gone or never was (skipped, released for
  room, dropped by its conversation) is noted in ``fates`` by content, so a
  request that falls short can say why (``engine.reuse.shortfall``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ignis.engine.page_pool import PagePool, PoolExhausted
from ignis.engine.reuse.block_events import NO_BLOCK_EVENTS
from ignis.engine.reuse.entries import KINDS, Entry, SlotPool
from ignis.engine.reuse.hashing import page_chain
from ignis.engine.sequence_pages import SequencePages
from ignis.engine.reuse.lower_index import WIRE_TIER, LowerIndex, LowerRecord, content_key
from ignis.engine.reuse.lower_moves import WAIT, LowerMoves
from ignis.engine.reuse.shortfall import Fates
from ignis.engine.tier_port import NO_TIERS, TierPort

log = logging.getLogger("ignis.engine")

CLASS_KEEP = {"agent": 0, "interactive": 1}
SLOT_WAIT_S = 0.5
"""A capture (or restore) that needs the slot of the entry it just sent down waits at most this long for
that copy to land; past it the capture is skipped ("slot_busy")."""


@dataclass(frozen=True)
class CaptureOrder:
    """What the runner must do after this round's forward to fill a new entry."""

    entry_id: int
    lane: int
    slot: int
    page_copies: tuple[tuple[int, int], ...]  # (src, dst): the partial last page's private copy
    kept_in_forward: bool = False
    """The forward keeps the image as it passes the point (a mark inside the chunk): after it, only the
    page copies are left to make."""
    before_round: bool = False
    """Made before anything else in the round (an aborted prefill's: its lane is free for this round's
    admissions, ``prefill_chunks.capture_aborted``)."""


@dataclass(frozen=True)
class ResumePoint:
    entry_id: int
    num_tokens: int
    slot: int
    pages: tuple[int, ...]
    kind: str
    slot_tier: str
    tier: str = "device"  # where the entry was found: "device", "kv_ram" or "kv_disk"


class RetainedStore:
    def __init__(self, pool: PagePool, slots: SlotPool, enabled: bool = True, stamp: str = "",
                 tiers: TierPort = NO_TIERS, restore_floors: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.time, blocks=NO_BLOCK_EVENTS):
        self.pool = pool
        self.blocks = blocks
        self.clock = clock  # wall clock for ``Entry.used_at``; ranking here uses ``_tick``
        self.stamp = stamp
        self.stamp_refusals = 0
        self.slots = slots
        self.enabled = enabled and slots.total > 0
        self._entries: dict[int, Entry] = {}
        self._by_hash: dict[bytes, list[Entry]] = {}
        self._entries_version = 0  # bumped whenever an entry comes or goes (``_pages_held``)
        self._held_key = -1  # the _entries_version _held was counted at
        self._held = 0
        self._next_id = 0
        self._clock = 0
        self._superseded: list[Entry] = []  # checkpoints a conversation dropped while pinned: released after the round
        self.tiers = tiers
        self._lower = LowerIndex(restore_floors or {}, blocks)
        self._lower_session = tiers.session
        self.moves = LowerMoves(pool, slots, tiers)
        self.pages_returning = 0
        """Pages the scheduler holds for one round and frees when it is applied (an aborted prefill's,
        kept for its capture): counted with the pages of demotes landing as room on its way."""
        self._wait_below: tuple[tuple[int, ...], int] = ((), 0)  # a lookup's lower match on its way
        self.demotions = 0
        self.restores = 0
        self.restore_rejections = 0  # restores whose bytes were not finite (dropped, recomputed)
        self.tier_give_ups = 0  # requests that stopped waiting for tierd (``give_up_below``)
        self.captures = 0
        self.captures_skipped = 0
        self.family_touches = 0  # entries ranked as used by the arrival of a request of their family
        self.flushes = 0  # cache resets (``flush``)
        self.hits = 0
        self.released = 0
        self.fates = Fates()

    def tell_blocks(self, blocks) -> None:
        """Report block changes to ``blocks`` (a ``BlockLedger``) from now on; before any entry exists."""
        if self._entries or len(self._lower):
            raise RuntimeError("tell_blocks must come before the first entry")
        self.blocks = blocks
        self._lower.blocks = blocks

    # ----- queries -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    @property
    def lower(self) -> LowerIndex:
        """The entries tierd holds for us as far as we know, with the restore floors; emptied
        when the port has said hello again since the last look (tierd holds nothing older)."""
        session = self.tiers.session
        if session != self._lower_session:
            self._lower.clear()
            self._lower_session = session
        return self._lower

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _find(self, tokens: tuple[int, ...], limit: int, kinds: tuple[str, ...] = KINDS,
              filled: bool | None = True) -> Entry | None:
        """Longest entry whose tokens are a prefix of ``tokens`` and at most ``limit`` long;
        ``filled``: True only entries whose image is in place, False only pending ones, None either."""
        pt = self.pool.page_tokens
        hashes = page_chain(tokens, pt, limit // pt)
        for k in range(len(hashes) - 1, -1, -1):
            best = None
            for e in self._by_hash.get(hashes[k], ()):
                n = e.num_tokens
                if e.kind not in kinds or n > limit or n > len(tokens) or e.full_pages != k:
                    continue
                if filled is not None and e.filled != filled:
                    continue
                if tuple(tokens[:n]) != e.tokens:  # verified token by token
                    continue
                if e.stamp != self.stamp:
                    self.stamp_refusals += 1
                    continue
                if best is None or n > best.num_tokens:
                    best = e
            if best is not None:
                return best
        return None

    def lookup(self, tokens: tuple[int, ...]) -> ResumePoint | None:
        """Where a request with ``tokens`` can resume: the longest retained prefix
        that leaves at least one token to prefill, on the device or (past its
        restore floor) in a lower tier. Pins the entry for this round."""
        if not self.enabled or len(tokens) < 2:
            return None
        self._wait_below = ((), 0)
        e = self._find(tokens, len(tokens) - 1)
        # the request whose restore was just refused computes from the device match (or from scratch)
        r = None if self.moves.rejected_for(tokens) else self._lower_choice(tokens, e.num_tokens if e else 0)
        if r is not None:
            self._promote(r, keep=e, tokens=tokens)
            e = self._find(tokens, len(tokens) - 1)  # the restored entry, when it landed at once
        if e is None:
            return None
        tier = WIRE_TIER[e.restored_from] if e.restored_from else "device"
        e.last_used = self._tick()
        e.used_at = self.clock()
        e.pinned = True
        self.hits += 1
        return ResumePoint(e.entry_id, e.num_tokens, e.slot, e.pages.pages, e.kind, self.slots.tier_of(e.slot), tier)

    def resumed(self, point: ResumePoint) -> None:
        """A request was admitted at ``point``: the tier a restored entry came from is named by that
        request only (it waited for the restore; a later hit is a device hit). A lookup whose request
        still waits (for pages, or for a capture ahead) leaves it for the one admitted."""
        e = self._entries.get(point.entry_id)
        if e is not None:
            e.restored_from = None

    def _lower_choice(self, tokens: tuple[int, ...], device_match: int) -> LowerRecord | None:
        """The lower-tier record worth restoring for ``tokens``, after asking tierd where its matches are now
        (not when none is long enough to pass a restore floor: a request never waits on tierd for nothing;
        a shorter match still counts against a longer one, ``LowerIndex.choose``)."""
        records = self.lower.matches(tokens, len(tokens) - 1, longer_than=device_match)
        if not records:
            return None
        if max(r.num_tokens for r in records) < self.lower.shortest_worth(device_match):
            self._below_floor(records)
            return None
        if self.moves.stalled:  # a request gave up waiting for tierd: none asks it again until it answers
            self._tier_failed(records)
            return None
        restoring = self.moves.restoring_prefix(tokens)
        if restoring > device_match:
            self._wait_below = (tokens, restoring)
            return None
        records = sorted(records, key=lambda r: -r.num_tokens)  # longest first: tierd ranks the first it
        where = self.moves.where(tuple(r.key for r in records))  # holds in each tier as used now
        if where is WAIT:
            self._wait_below = (tokens, max(r.num_tokens for r in records))
            return None
        if where is None:  # tierd cannot answer: a restore would not either; the request says so (shortfall)
            self._tier_failed(records)
            return None
        self.lower.update(where)
        records = [r for r in records if where.get(r.key) is not None]
        pick = self.lower.choose(records, device_match)
        if pick is None:
            self._below_floor(records)
        return pick

    def _below_floor(self, records: list[LowerRecord]) -> None:
        """Matches kept in a lower tier that no restore floor lets this request take: its shortfall says so."""
        for r in records:
            self.fates.note(tuple(r.tokens), "below_floor")

    def _promote(self, r: LowerRecord, keep: Entry | None, tokens: tuple[int, ...]) -> None:
        """Post the copy of a lower-tier entry back into fresh pages and a slot; it is a device entry
        again once it lands (now, for a port that answers at once; else in a later round's poll).
        The whole pages of the device match (a prefix of the entry) are shared, not copied: only the
        pages past them are taken and read."""
        shared = 0
        if keep is not None:
            keep.pinned = True  # the device match stays usable if the restore misses
            shared = keep.num_tokens // self.pool.page_tokens
        n = len(r.tokens)
        needed = self.pool.pages_for(n) - shared
        if needed > self.pool.num_free:
            self.reclaim_pages(needed)
        if needed > self.pool.num_free:
            if self.pool.num_free + self.pages_coming >= needed:
                self._wait_below = (tokens, n)  # room on its way: ask again next round
            else:
                self.fates.note(tuple(r.tokens), "no_room")  # the request computes it (its shortfall says so)
            return
        slot = self._slot_for(r.request_class, host_only=True)  # tierd writes images into host slots only
        if slot is None:
            self.fates.note(tuple(r.tokens), "no_room")
            return
        owner = SequencePages(self.pool, f"restored-{self._next_id}-{r.key[:8]}")
        try:
            if shared:
                owner.fork_from(keep.pages.pages, shared * self.pool.page_tokens)  # whole pages: no copy
            owner.ensure_capacity(n)
        except PoolExhausted:
            owner.release()
            self.slots.give_back(slot)
            self.fates.note(tuple(r.tokens), "no_room")
            return
        self.moves.restore(r, owner, slot, self._restored, self._missed, shared)

    def _restored(self, r: LowerRecord, owner: SequencePages, slot: int, read_from: str) -> None:
        self.restores += 1
        self.lower.move(r.key, read_from)  # tierd keeps its copy: restoring never consumes
        e = self._register(tuple(r.tokens), owner, slot, r.kind, r.request_class, r.after_user)
        e.restored_from = read_from

    def _missed(self, r: LowerRecord, rejected: bool) -> None:
        if rejected:
            self.restore_rejections += 1
        self.lower.forget(r.key)
        self.fates.note(tuple(r.tokens), "tier_failed")  # the request that waited for it says so (shortfall)

    def claim_rejections(self, tokens: tuple[int, ...]) -> int:
        """Restores of prefixes of ``tokens`` refused for non-finite bytes since a request was last told."""
        return self.moves.claim_rejections(tokens)

    # ----- captures ------------------------------------------------------------

    def capture(self, tokens: tuple[int, ...], live: SequencePages, lane: int, kind: str, request_class: str,
                after_user: bool, claim_as: str | None = None, family: str | None = None) -> CaptureOrder | None:
        """Retain ``tokens`` (the first len(tokens) positions of ``live``), or skip. ``claim_as``: the class
        the entry ranks as (default ``request_class``, the class of the request that made it); ``family``:
        the cache family of that request (``touch_family``)."""
        if not self.enabled:
            return None
        if kind not in KINDS:
            raise ValueError(f"capture kind must be one of {KINDS}, got {kind!r}")
        n = len(tokens)
        same = self._find(tokens, n, filled=None)
        if same is not None and same.num_tokens == n:
            same.last_used = self._tick()
            same.used_at = self.clock()
            same.family = same.family or family
            return None
        request_class = claim_as or request_class
        if kind == "prompt_checkpoint" and not self.slots.num_free:
            # the checkpoints this one puts past its conversation's budget give up their slots first,
            # rather than another conversation's entry (each capture would otherwise push out one)
            for p in self._over_budget(self._parent_checkpoint(tokens)):
                if not p.pinned:
                    self._release(p, fate="budget")
        slot = self._slot_for(request_class)
        if slot is None:
            self.captures_skipped += 1
            self.fates.note(tuple(tokens), "slot_busy")
            return None
        owner = SequencePages(self.pool, f"retained-{self._next_id}")
        try:
            if self.pool.pages_for(n) and n % self.pool.page_tokens and self.pool.num_free < 1:
                self._free_pages_now(1)
            copies = owner.fork_from(live.pages, n)
        except PoolExhausted:
            owner.release()
            self.slots.give_back(slot)
            self.captures_skipped += 1
            self.fates.note(tuple(tokens), "slot_busy")
            return None
        e = self._register(tuple(tokens), owner, slot, kind, request_class, after_user, filled=False)
        e.family = family
        self.captures += 1
        if kind == "prompt_checkpoint":
            self._link_conversation(e)
        return CaptureOrder(e.entry_id, lane, slot, tuple(copies))

    def _register(self, tokens: tuple[int, ...], owner: SequencePages, slot: int, kind: str, request_class: str,
                  after_user: bool, filled: bool = True) -> Entry:
        full_hash = page_chain(tokens, self.pool.page_tokens)[-1]
        e = Entry(self._next_id, tokens, full_hash, owner, slot, kind, request_class, after_user,
                  self._tick(), pinned=True, filled=filled, stamp=self.stamp, used_at=self.clock())
        self._next_id += 1
        self._entries[e.entry_id] = e
        self._entries_version += 1
        self._by_hash.setdefault(full_hash, []).append(e)
        self.blocks.held(e.tokens, "GPU")
        return e

    def _slot_for(self, request_class: str, host_only: bool = False) -> int | None:
        """A free slot, or the slot of the lowest-ranked entry ranked no higher than ``request_class``
        (``host_only``: a host slot, for an image tierd writes)."""
        slot = self.slots.take(host_only)
        if slot is not None:
            return slot
        victim = self._lowest(host_only=host_only)
        if victim is None or CLASS_KEEP[victim.request_class] > CLASS_KEEP[request_class]:
            return None
        slot = victim.slot
        if not self._release(victim, keep_slot=True, demote=True):
            # its slot is read by the demote just posted: a capture is worth a short wait for that copy
            if not self.moves.wait_for_slot(slot, SLOT_WAIT_S):
                return None
            return self.slots.take(host_only)
        return slot

    def _link_conversation(self, e: Entry) -> None:
        """``e`` is the conversation's latest checkpoint; of its ancestors only the nearest one made
        right after a real user message stays (where a regenerate, or a fork from the last user
        turn, resumes), so a conversation holds at most two."""
        e.parent = self._parent_checkpoint(e.tokens)
        for p in self._over_budget(e.parent):
            if p.pinned:  # read or filled this round: it goes once the round is applied
                self._superseded.append(p)
            else:
                self._release(p, fate="budget")

    def _parent_checkpoint(self, tokens: tuple[int, ...]) -> Entry | None:
        return self._find(tokens, len(tokens) - 1, kinds=("prompt_checkpoint",), filled=None)

    @staticmethod
    def _over_budget(parent: Entry | None) -> list[Entry]:
        """The checkpoints a new one under ``parent`` puts past the budget: every ancestor but the nearest
        one made right after a real user message."""
        out, kept_user = [], False
        p = parent
        while p is not None:
            if p.after_user and not kept_user:
                kept_user = True
            else:
                out.append(p)
            p = p.parent
        return out

    # ----- ranking and release --------------------------------------------------

    def touch_family(self, family: str | None) -> int:
        """A request of cache family ``family`` arrived: the entries its family made count as used now
        (ranked as recently used, their TTL restarted), so an active conversation family keeps its
        entries over idle ones. A hint for ranking only: lookups stay by content. Returns how many."""
        if family is None:
            return 0
        touched = 0
        for e in self._entries.values():
            if e.family == family:
                e.last_used = self._tick()
                e.used_at = self.clock()
                touched += 1
        self.family_touches += touched
        return touched

    def _lowest(self, host_only: bool = False, freeing: bool = False) -> Entry | None:
        """The lowest-ranked unpinned entry (``host_only``: of those in host slots; ``freeing``: of those
        holding a page no one else does, whose release gives the pool a page)."""
        candidates = [e for e in self._entries.values() if not e.pinned
                      and (not host_only or self.slots.tier_of(e.slot) == "host")
                      and (not freeing or e.pages.sole())]
        if not candidates:
            return None
        return min(candidates, key=lambda e: (CLASS_KEEP[e.request_class], e.last_used))

    @property
    def pages_coming(self) -> int:
        """Pages that go back to the free list by the next round without anyone giving any up: those of
        demotes in flight, and those the scheduler returns when the round is applied."""
        return self.moves.pages_landing + self.pages_returning

    def reclaim_pages(self, needed_free: int) -> int:
        """Release entries, lowest-ranked first, until ``needed_free`` pages are free or on their way
        (``pages_coming``), or nothing more can go. Returns how many entries were released."""
        released = 0
        while self.pool.num_free + self.pages_coming < needed_free:
            victim = self._lowest()
            if victim is None:
                break
            self._release(victim, demote=True)
            released += 1
        return released

    def _free_pages_now(self, needed_free: int) -> None:
        """Release entries, lowest-ranked first, until ``needed_free`` pages are free in the pool now (a
        capture's partial last page cannot wait for a later round). Pages a demote's copy still reads are
        not free: that copy is waited for, as a capture waits for a slot (``SLOT_WAIT_S``); one that does
        not land in time ends the attempt (the capture is then skipped). Only entries whose release frees a
        page go: one whose pages all a running sequence (or another entry) shares would be lost for nothing."""
        while self.pool.num_free < needed_free:
            victim = self._lowest(freeing=True)
            if victim is None:
                return
            slot, landing = victim.slot, self.moves.pages_landing
            if self._release(victim, demote=True) or self.moves.pages_landing == landing:
                continue  # its pages are free now
            if not self.moves.wait_for_slot(slot, SLOT_WAIT_S):
                return

    def _release(self, e: Entry, keep_slot: bool = False, demote: bool = False, fate: str = "evicted") -> bool:
        """Free an entry's pages and slot. ``demote``: the device needs the room, so the
        entry first moves down a tier if one is connected (lazy demotion: only now); while that
        copy is in flight its pages and slot stay held (``LowerMoves``), and False says the slot
        was not kept for the caller. ``fate``: why it goes ("evicted" for room, "budget" for its
        conversation's budget)."""
        slot_free = True
        self.fates.note(e.tokens, fate)
        if demote:
            def landed(tier, e=e):
                self.demotions += 1
                self.lower.add(LowerRecord(content_key(e.tokens), e.tokens, e.kind, e.request_class,
                                           e.after_user, tier))

            def failed(_reason, e=e):  # tierd not connected or not answering: a request that falls short says so
                self.fates.note(e.tokens, "tier_failed")

            slot_free = self.moves.demote(e.tokens, e.pages, e.slot, e.request_class, e.used_at, landed, failed)
        del self._entries[e.entry_id]
        self._entries_version += 1
        bucket = self._by_hash[e.full_hash]
        bucket.remove(e)
        if not bucket:
            del self._by_hash[e.full_hash]
        for other in self._entries.values():
            if other.parent is e:
                other.parent = e.parent
        e.pages.release()
        self.blocks.dropped(e.tokens, "GPU")
        if slot_free and not keep_slot:
            self.slots.give_back(e.slot)
        self.released += 1
        return slot_free

    def pending_prefix(self, tokens: tuple[int, ...]) -> int:
        """Tokens of the longest pending capture, or lower-tier match being looked up or restored,
        that a request with ``tokens`` could resume from once it is in place (0 if none)."""
        if not self.enabled or len(tokens) < 2:
            return 0
        e = self._find(tokens, len(tokens) - 1, filled=False)
        return max(e.num_tokens if e is not None else 0, self.pending_below(tokens))

    def pending_below(self, tokens: tuple[int, ...]) -> int:
        """Tokens of the longest lower-tier match of ``tokens`` being looked up, restored, or waiting for
        room to land in (0 if none): what only tierd can bring."""
        if not self.enabled or len(tokens) < 2 or self.moves.stalled:
            return 0
        waited, below = self._wait_below
        below = below if tuple(waited) == tuple(tokens) else 0
        return max(below, self.moves.restoring_prefix(tokens))

    def _tier_failed(self, records) -> None:
        """These lower-tier records will not come back for the request asking: it says so (shortfall)."""
        for r in records:
            self.fates.note(tuple(r.tokens), "tier_failed")

    def give_up_below(self, tokens: tuple[int, ...], waited_s: float) -> None:
        """A request waited past its bound for tierd (``SchedulerConfig.tier_wait_limit_s``) for its lower-tier
        match: the match is given up (a request that falls short says ``tier_failed``), and until tierd
        answers something no request asks it, nor waits for a restore in flight (``LowerMoves.stalled``).
        What is in flight goes on: a restore that lands later is a device entry like any other."""
        self._tier_failed(self.lower.matches(tokens, len(tokens) - 1, longer_than=0))
        self.moves.stalled = True
        self._wait_below = ((), 0)
        self.tier_give_ups += 1
        log.warning("tierd did not bring a match back in %.1f s: the request computes it, and no request waits "
                    "for tierd until it answers again (ignis:reuse_tier_give_ups_total)", waited_s)

    def mark_filled(self, entry_ids) -> None:
        """The round that captured these entries has been applied: their slots hold their images."""
        for entry_id in entry_ids:
            e = self._entries.get(entry_id)
            if e is not None:
                e.filled = True

    @property
    def copies_in_flight(self) -> int:
        """Demotes, restores and lookups posted to tierd and not answered yet."""
        return self.moves.in_flight

    def unpin_all(self) -> None:
        """The round is applied: nothing is pinned, and superseded checkpoints are released."""
        for e in self._entries.values():
            e.pinned = False
        superseded, self._superseded = self._superseded, []
        for e in superseded:
            if self._entries.get(e.entry_id) is e:
                self._release(e, fate="budget")

    def release_all(self) -> None:
        """Free every retained entry here and forget those below (a switch, an unload, a stop)."""
        self.blocks.cleared()
        for e in list(self._entries.values()):
            self._release(e)
        self.lower.clear()

    def flush(self) -> tuple[int, bool]:
        """Drop every retained entry in every tier (a cache reset), with nothing pinned and no copy in
        flight: free those here, start a new session below (tierd drops what it held for us), forget
        the fates of captures. Returns the entries dropped (here and as far as we knew below) and
        whether the lower tiers were told (False: unreachable; they begin empty when they are back)."""
        if self.moves.in_flight or any(e.pinned for e in self._entries.values()):
            raise RuntimeError("flush needs no entry pinned and no copy in flight")
        dropped = len(self._entries) + len(self.lower)
        self.release_all()
        self._superseded.clear()
        self.fates = Fates()
        self.moves.forget_answers()
        self.flushes += 1
        return dropped, self.tiers.renew()

    def _pages_held(self) -> int:
        """Distinct pages the retained entries hold (entries share pages), counted again only when an entry
        came or went: the gauges read it every loop turn, and a walk of every page of 32 entries of 120K-token
        prompts costs a millisecond."""
        if self._entries_version != self._held_key:
            self._held = len({p for e in self._entries.values() for p in e.pages.pages})
            self._held_key = self._entries_version
        return self._held

    def stats(self) -> dict[str, int]:
        return {
            "retained_entries": len(self._entries),
            "retained_slots_free": self.slots.num_free,
            "retained_slots_total": self.slots.total,
            "retained_pages_held": self._pages_held(),
            "reuse_captures_total": self.captures,
            "reuse_captures_skipped_total": self.captures_skipped,
            "reuse_family_touches_total": self.family_touches,
            "reuse_flushes_total": self.flushes,
            "reuse_hits_total": self.hits,
            "reuse_released_total": self.released,
            "reuse_stamp_refusals_total": self.stamp_refusals,
            "reuse_demotions_total": self.demotions,
            "reuse_restores_total": self.restores,
            "reuse_restore_rejected_total": self.restore_rejections,
            "reuse_tier_give_ups_total": self.tier_give_ups,
            "retained_lower_entries": len(self.lower),
            "retained_lower_forgotten_total": self.lower.forgotten,
        }
