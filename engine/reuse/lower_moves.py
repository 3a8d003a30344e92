"""The retained store's exchanges with tierd in flight: demotes, restores and lookups, as handles.

Pure Python, no torch. Every exchange is posted through the ``TierPort`` and
completed by its ``poll`` at the start of a round (``engine.tier_ops``);
nothing here waits. What each one holds while it is in flight::

    demote   the entry is gone from the index at once; its pages (a PageHold)
             and its slot stay out of the pool until Demoted (or a failure)
             arrives; then the record goes to the LowerIndex (tier it landed in)
    restore  fresh pages and a slot, reserved and not in any page table; on
             Restored the bytes are checked (finite rows and image) and the
             entry is registered, filled and pinned for the round, so the
             request that waited for it resumes from it that round; a miss or
             a rejection frees them once tierd no longer writes them
    lookup   nothing; the answer (where tierd holds a prompt's matches now)
             is kept for the round it arrives in

A request whose best match is a lower-tier record waits (head of its queue)
while that record's lookup or restore is in flight: it is admitted in the
round after the bytes land. ``pages_landing`` counts the pages that go back
to the pool when the demotes in flight land, so room for an admission is
not asked of more entries than needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ignis.engine.page_pool import PagePool
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.lower_index import LowerRecord
from ignis.engine.sequence_pages import SequencePages
from ignis.engine.tier_ops import PageHold, TierOp, as_op
from ignis.engine.tier_port import TierPort

WAIT = object()
"""``where``'s answer while a lookup is in flight."""


@dataclass
class _Demoting:
    op: TierOp
    hold: PageHold
    slot: int


@dataclass
class _Restoring:
    record: LowerRecord
    owner: SequencePages
    slot: int
    op: TierOp


class LowerMoves:
    def __init__(self, pool: PagePool, slots: SlotPool, tiers: TierPort):
        self.pool = pool
        self.slots = slots
        self.tiers = tiers
        self.demoting: list[_Demoting] = []
        self.restoring: dict[str, _Restoring] = {}
        self._located: dict[tuple[str, ...], TierOp] = {}
        self._answered: dict[tuple[str, ...], int] = {}  # keys -> the round their answer came in
        self._round = 0
        self._unclaimed: list[tuple[int, ...]] = []  # tokens of rejected restores no request was told of
        self._made = 0
        self.stalled = False
        """A request waited past its bound for tierd: no lookup is asked, nor a restore in flight waited for,
        until tierd answers something (any exchange ends: ``_heard``)."""

    @property
    def in_flight(self) -> int:
        return len(self.demoting) + len(self.restoring) + sum(op.pending for op in self._located.values())

    @property
    def pages_landing(self) -> int:
        """Pages that go back to the free list once the demotes in flight land."""
        return sum(d.hold.sole() for d in self.demoting)

    def forget_answers(self) -> None:
        """Nothing in flight and the lower tiers start again empty (a cache reset): answers about where
        keys were, and restores refused that no request was told of, no longer hold."""
        if self.in_flight:
            raise RuntimeError("forget_answers needs nothing in flight")
        self._located.clear()
        self._answered.clear()
        self._unclaimed.clear()

    def round_start(self) -> None:
        """A new round (``Scheduler.schedule``): lookup answers older than the last round are stale."""
        self._round += 1
        for keys in [k for k, r in self._answered.items() if r < self._round - 1]:
            del self._answered[keys]
            self._located.pop(keys, None)

    # ----- demote ------------------------------------------------------------------

    def demote(self, tokens, pages: SequencePages, slot: int, request_class: str, last_used: float,
               landed: Callable[[str], None], failed: Callable[[str], None] | None = None) -> bool:
        """Post the demote of an entry the store lets go of; ``landed(tier)`` when it is below,
        ``failed(reason)`` when tierd could not take it for another reason than a full tier (not
        connected, not answering, gone). True: done already (the caller frees pages and slot now);
        False: pages and slot are held here and freed when the copy is done (the caller only drops its
        page table)."""
        op = as_op("demote", self.tiers.demote_retained(tokens, pages.pages, slot, request_class,
                                                        last_used=last_used))
        session = self.tiers.session

        def done(o: TierOp) -> None:
            self._heard(o)
            if o.ok and self.tiers.session == session:
                landed(o.value)
            elif not o.ok and failed is not None and o.reason not in ("no_room", "refused"):
                failed(o.reason)

        op.when_done(done)
        if not op.pending:
            return True
        self._made += 1
        d = _Demoting(op, PageHold(self.pool, pages.pages, f"demoting-{self._made}"), slot)
        self.demoting.append(d)
        op.when_done(lambda o: self._demoted(d))
        return False

    def _heard(self, op: TierOp) -> None:
        """An exchange with tierd ended (an answer, or the client's own timeout): tierd is not taken as
        stalled. One the port refused without asking (a device slot's entry, no tiers) says nothing of it."""
        if op.ok or op.reason != "refused":
            self.stalled = False

    def wait_for_slot(self, slot: int, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the demote in flight that reads ``slot`` to land, so the slot is
        free again; False when there is none, the port cannot wait, or it did not land in time."""
        d = next((d for d in self.demoting if d.slot == slot), None)
        wait = getattr(self.tiers, "wait", None)
        if d is None or wait is None:
            return False
        wait(d.op, timeout_s)
        return not d.op.pending

    def _demoted(self, d: _Demoting) -> None:
        self.demoting.remove(d)
        d.hold.release()
        self.slots.give_back(d.slot)

    # ----- lookup --------------------------------------------------------------------

    def where(self, keys: tuple[str, ...]):
        """Where tierd holds ``keys`` now (a dict), None when it cannot say, or ``WAIT`` (asked; the
        answer comes in a later round)."""
        op = self._located.get(keys)
        if op is None:
            op = as_op("lookup", self.tiers.locate(list(keys)))
            self._located[keys] = op
            op.when_done(lambda o: self._heard(o) or self._answered.__setitem__(keys, self._round))
        if op.pending:
            return WAIT
        del self._located[keys]
        self._answered.pop(keys, None)
        return op.value if op.ok else None

    # ----- restore -------------------------------------------------------------------

    def restoring_prefix(self, tokens: tuple[int, ...]) -> int:
        """Tokens of the longest restore in flight whose tokens are a prefix of ``tokens`` (0: none)."""
        best = 0
        for r in self.restoring.values():
            n = r.record.num_tokens
            if n > best and n < len(tokens) and r.record.is_prefix_of(tokens):
                best = n
        return best

    def restore(self, record: LowerRecord, owner: SequencePages, slot: int,
                landed: Callable[[LowerRecord, SequencePages, int, str], None],
                missed: Callable[[LowerRecord, bool], None], shared: int = 0) -> None:
        """Post the restore of ``record`` into ``owner``'s pages and ``slot`` (its first ``shared`` pages
        already hold the record's prefix, shared from a device entry: they are not copied). When it lands
        and its bytes are finite: ``landed(record, owner, slot, tier)`` (the store registers it).
        Otherwise ``missed(record, rejected)``, and the pages and slot are freed once tierd no longer
        writes them."""
        op = as_op("restore", self.tiers.restore_retained(record.key, owner.pages[shared:], slot, shared))
        r = _Restoring(record, owner, slot, op)
        self.restoring[record.key] = r
        op.when_done(lambda o: self._restored(r, landed, missed))

    def _restored(self, r: _Restoring, landed, missed) -> None:
        self._heard(r.op)
        self.restoring.pop(r.record.key, None)
        if r.op.ok:
            if self.tiers.check_restored(r.owner.pages, r.record.num_tokens, r.slot):
                return landed(r.record, r.owner, r.slot, r.op.value)
            self._unclaimed.append(tuple(r.record.tokens))
            self.tiers.drop_retained(r.record.key)  # non-finite bytes: never used, the copy below goes too
        missed(r.record, r.op.ok)

        def free(_op):
            r.owner.release()
            self.slots.give_back(r.slot)

        r.op.when_free(free)

    def rejected_for(self, tokens: tuple[int, ...]) -> bool:
        """A restore of a prefix of ``tokens`` was refused and no request was told yet."""
        return any(tuple(tokens[:len(t)]) == t for t in self._unclaimed)

    def claim_rejections(self, tokens: tuple[int, ...]) -> int:
        """Rejected restores of prefixes of ``tokens`` that no request was told of yet (now told)."""
        mine = [t for t in self._unclaimed if tuple(tokens[:len(t)]) == t]
        for t in mine:
            self._unclaimed.remove(t)
        return len(mine)
