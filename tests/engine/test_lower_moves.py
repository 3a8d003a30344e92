"""The retained store with a tier that answers later: what a demote or restore in flight holds, and when.

Pure Python: a fake port whose exchanges stay pending until the test
answers them, as tierd's replies arrive in a later round's poll.
"""

from __future__ import annotations

from ignis.engine.page_pool import PagePool
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.lower_index import content_key
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.tier_ops import TierOp
from ignis.engine.tier_port import NullTierPort
from tests.engine.test_reuse_store import live_seq, round_applied, toks


class LaterTier(NullTierPort):
    """Every demote, restore and lookup is answered only when the test says so (``answer``)."""

    session = 1

    def __init__(self):
        self.ops: list[tuple[str, tuple, TierOp]] = []
        self.held: dict[str, str] = {}

    def _post(self, what, *args):
        op = TierOp(what)
        self.ops.append((what, args, op))
        return op

    def demote_retained(self, tokens, pages, slot, request_class, last_used=None):
        return self._post("demote", content_key(tokens), tuple(pages), slot)

    def restore_retained(self, key, pages, slot, skip=0):
        return self._post("restore", key, tuple(pages), slot, *((skip,) if skip else ()))

    def locate(self, keys):
        return self._post("lookup", tuple(keys))

    def pending(self, what):
        return [(args, op) for w, args, op in self.ops if w == what and op.pending]

    def answer(self, what, value=None):
        """Complete every pending exchange of this kind (demotes land in ``value``, default "ram")."""
        for args, op in self.pending(what):
            if what == "demote":
                self.held[args[0]] = value or "ram"
                op.finish(value or "ram")
            elif what == "lookup":
                op.finish({k: self.held.get(k) for k in args[0]})
            else:
                op.finish(self.held.get(args[0]))


def retained(tier, pages=8, host=2):
    pool = PagePool(pages)
    store = RetainedStore(pool, SlotPool(0, host), tiers=tier, restore_floors={"ram": 64, "disk": 64})
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    seq.release()
    round_applied(store)
    return pool, store


def test_a_demote_in_flight_holds_its_pages_and_slot_until_it_lands():
    tier = LaterTier()
    pool, store = retained(tier)
    assert store.reclaim_pages(8) == 1  # one entry released: its four pages are on their way
    assert len(store) == 0 and pool.num_free == 4 and store.moves.pages_landing == 4
    assert store.slots.num_free == 1  # its slot is read by the copy
    assert store.reclaim_pages(8) == 0 and store.copies_in_flight == 1  # nothing more to ask for
    pool.integrity_check()
    tier.answer("demote")
    assert pool.num_free == 8 and store.slots.num_free == 2 and store.moves.pages_landing == 0
    assert len(store.lower) == 1 and store.demotions == 1 and store.copies_in_flight == 0
    pool.integrity_check()


def test_a_failed_demote_frees_its_room_and_records_nothing_below():
    tier = LaterTier()
    pool, store = retained(tier)
    store.reclaim_pages(8)
    (_, op), = tier.pending("demote")
    op.fail("timeout")
    assert pool.num_free == 8 and store.slots.num_free == 2 and len(store.lower) == 0


def test_a_lower_match_is_looked_up_then_restored_then_resumed_in_later_rounds():
    tier = LaterTier()
    pool, store = retained(tier)
    store.reclaim_pages(8)
    tier.answer("demote")
    prompt = toks(230)
    assert store.lookup(prompt) is None and store.pending_prefix(prompt) == 200  # asked where it is: wait
    store.unpin_all()
    tier.answer("lookup")
    assert store.lookup(prompt) is None and store.pending_prefix(prompt) == 200  # restore posted: wait
    (args, op), = tier.pending("restore")
    assert len(args[1]) == 4 and pool.num_free == 4 and store.slots.num_free == 1  # reserved, in no table
    assert store.lookup(prompt) is None and len(tier.pending("restore")) == 1  # posted once
    store.unpin_all()
    tier.answer("restore")
    hit = store.lookup(prompt)
    assert (hit.num_tokens, hit.tier) == (200, "kv_ram") and store.pending_prefix(prompt) == 0
    store.resumed(hit)  # admitted with it
    round_applied(store)
    assert store.lookup(prompt).tier == "device"  # later hits are device hits
    store.release_all()
    assert pool.num_free == 8 and store.slots.num_free == 2
    pool.integrity_check()


def test_a_restore_that_misses_frees_its_room_only_once_tierd_is_done_with_it():
    tier = LaterTier()
    pool, store = retained(tier)
    store.reclaim_pages(8)
    tier.answer("demote")
    store.lookup(toks(230))
    tier.answer("lookup")
    store.lookup(toks(230))
    (_, op), = tier.pending("restore")
    op.fail("timeout", memory_free=False)  # tierd may still be writing the destination
    assert store.pending_prefix(toks(230)) == 0 and len(store.lower) == 0  # the request computes instead
    assert pool.num_free == 4 and store.slots.num_free == 1  # quarantined
    op.release()
    assert pool.num_free == 8 and store.slots.num_free == 2
    pool.integrity_check()


def test_a_capture_never_takes_the_slot_of_an_entry_whose_demote_is_in_flight():
    tier = LaterTier()
    pool = PagePool(16)
    store = RetainedStore(pool, SlotPool(0, 1), tiers=tier)
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    other = live_seq(pool, 130, "other")
    assert store.capture(toks(130, 500), other, 1, "retained_prefix", "interactive", False) is None  # skipped
    assert store.slots.num_free == 0 and len(tier.pending("demote")) == 1
    tier.answer("demote")
    assert store.slots.num_free == 1
    seq.release()
    other.release()
    assert pool.num_free == 16
    pool.integrity_check()


class CopyingTier(LaterTier):
    """A tier whose port can wait for an exchange (as the engine's does): the copy lands while it waits."""

    def __init__(self):
        super().__init__()
        self.waits = 0

    def wait(self, op, timeout_s):
        self.waits += 1
        self.answer("demote")
        return op


def test_a_capture_short_of_its_last_page_waits_for_the_demote_that_frees_one():
    """The pool is full and the capture needs one page of its own (its tokens end inside a page): the
    lowest entry is demoted, and the capture waits for that copy to land rather than count its pages as
    free and be skipped (before, it was skipped as slot_busy, and the victim had left the device for
    nothing)."""
    tier = CopyingTier()
    pool = PagePool(8)
    store = RetainedStore(pool, SlotPool(0, 3), tiers=tier, restore_floors={"ram": 64, "disk": 64})
    first = live_seq(pool, 200)  # 4 pages of 64 tokens: 200 tokens end inside the last one
    store.capture(toks(200), first, 0, "prompt_checkpoint", "interactive", True)
    first.release()
    round_applied(store)
    assert pool.num_free == 4
    seq = live_seq(pool, 250, name="other")  # 4 pages: the pool is full
    assert pool.num_free == 0
    order = store.capture(toks(250, base=7), seq, 1, "prompt_checkpoint", "interactive", True)
    assert order is not None and tier.waits == 1, "skipped although the demoted entry's pages were coming"
    assert store.captures_skipped == 0 and len(store.lower) == 1  # the victim went to KV-RAM
    seq.release()
    round_applied(store)
    store.release_all()
    assert pool.num_free == 8
    pool.integrity_check()
