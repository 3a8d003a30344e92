"""The retained store alone: no torch, no model; exact entries, pages, slots and orders."""

from __future__ import annotations

import sys

import pytest

from ignis.engine.page_pool import PagePool
from ignis.engine.reuse import hashing
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.reuse.lower_index import content_key
from ignis.engine.sequence_pages import SequencePages
from ignis.engine.tier_port import NullTierPort


def live_seq(pool: PagePool, tokens: int, name="live") -> SequencePages:
    seq = SequencePages(pool, name)
    seq.ensure_capacity(tokens)
    return seq


def toks(n: int, base: int = 0) -> tuple[int, ...]:
    return tuple(base + i for i in range(n))


def round_applied(store: RetainedStore) -> None:
    """What the scheduler's ``update`` does once a round ran: its captures are filled, nothing stays pinned."""
    store.mark_filled(e.entry_id for e in store.entries())
    store.unpin_all()


def make(pages=32, device=0, host=4, **kw):
    pool = PagePool(pages)
    return pool, RetainedStore(pool, SlotPool(device, host), **kw)


def test_capture_shares_full_pages_and_copies_the_partial_one():
    pool, store = make()
    seq = live_seq(pool, 150)  # pages 0, 1, 2
    order = store.capture(toks(150), seq, lane=3, kind="prompt_checkpoint", request_class="interactive",
                          after_user=True)
    assert order.lane == 3 and order.slot == 0
    assert order.page_copies == ((2, 3),)
    (entry,) = store.entries()
    assert entry.pages.pages == (0, 1, 3)
    assert [pool.refcount(p) for p in (0, 1, 2, 3)] == [2, 2, 1, 1]
    seq.release()
    round_applied(store)
    store.release_all()
    assert pool.num_free == pool.num_pages and store.slots.num_free == 4
    pool.integrity_check()


def test_lookup_takes_the_longest_prefix_leaving_one_token_and_never_consumes():
    pool, store = make()
    seq = live_seq(pool, 300)
    store.capture(toks(128), seq, 0, "retained_prefix", "interactive", False)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    hit = store.lookup(toks(260))
    assert (hit.num_tokens, hit.kind) == (200, "prompt_checkpoint")
    assert store.lookup(toks(260)).num_tokens == 200  # still there
    assert store.lookup(toks(200)).num_tokens == 128  # must leave a token to prefill
    assert store.lookup(toks(150)).num_tokens == 128
    assert store.lookup(toks(127)) is None
    assert store.lookup(toks(150, base=1)) is None  # differs from the first token
    other = toks(128)[:100] + (9999,) + toks(300)[101:260]
    assert store.lookup(other) is None
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_a_restored_entry_names_its_tier_to_the_request_admitted_with_it():
    """A request whose restore landed may wait rounds more before it is admitted (pages on their way, a
    capture ahead): every lookup until then names the lower tier; the hit of the one admitted clears it."""
    pool, store = make()
    seq = live_seq(pool, 300)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    (entry,) = store.entries()
    entry.restored_from = "disk"  # as the restore's landing leaves it
    assert store.lookup(toks(260)).tier == "kv_disk"
    hit = store.lookup(toks(260))  # the head was not admitted: it asks again next round
    assert hit.tier == "kv_disk"
    store.resumed(hit)
    assert store.lookup(toks(260)).tier == "device"
    seq.release()
    store.release_all()


def test_a_pending_capture_is_never_a_resume_point_until_its_round_is_applied():
    pool, store = make()
    seq = live_seq(pool, 300)
    order = store.capture(toks(128), seq, 0, "retained_prefix", "agent", False)
    assert store.lookup(toks(200)) is None  # its slot holds nothing yet
    assert store.pending_prefix(toks(200)) == 128
    assert store.pending_prefix(toks(128)) == 0  # must leave a token to prefill
    assert store.capture(toks(128), seq, 1, "retained_prefix", "agent", False) is None  # one entry per tokens
    store.mark_filled([order.entry_id])
    store.unpin_all()
    assert store.pending_prefix(toks(200)) == 0
    assert store.lookup(toks(200)).num_tokens == 128
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_same_tokens_are_not_captured_twice():
    pool, store = make()
    seq = live_seq(pool, 100)
    assert store.capture(toks(90), seq, 0, "prompt_checkpoint", "interactive", True) is not None
    assert store.capture(toks(90), seq, 1, "prompt_checkpoint", "interactive", True) is None
    assert len(store) == 1
    seq.release()
    store.release_all()


def test_candidates_are_verified_token_by_token(monkeypatch):
    """Even if two prefixes collided in the hash, the token check keeps them apart."""
    pool, store = make()
    monkeypatch.setattr(sys.modules["ignis.engine.reuse.store"], "page_chain",
                        lambda tokens, pt, limit=None: [hashing.SEED] * (1 + min(len(tokens) // pt,
                                                                                  limit if limit is not None else 10**9)))
    seq = live_seq(pool, 200)
    store.capture(toks(130), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    assert store.lookup(toks(140)).num_tokens == 130
    assert store.lookup(toks(140, base=5)) is None
    seq.release()
    store.release_all()


def test_slots_rank_agent_below_interactive_then_lru():
    pool, store = make(host=2)
    seq = live_seq(pool, 400)
    store.capture(toks(70), seq, 0, "prompt_checkpoint", "interactive", True)
    store.capture(toks(80, 1000), seq, 0, "prompt_checkpoint", "agent", True)
    round_applied(store)
    # interactive capture with no free slot: the agent entry gives way
    assert store.capture(toks(90, 2000), seq, 0, "prompt_checkpoint", "interactive", True) is not None
    assert sorted(e.tokens[0] for e in store.entries()) == [0, 2000]
    round_applied(store)
    # an agent capture may not evict interactive entries: skipped
    assert store.capture(toks(75, 3000), seq, 0, "prompt_checkpoint", "agent", True) is None
    assert store.captures_skipped == 1
    # between interactive entries the least recently used goes; a lookup refreshes
    store.lookup(toks(71))
    round_applied(store)
    store.capture(toks(95, 4000), seq, 0, "prompt_checkpoint", "interactive", True)
    assert sorted(e.tokens[0] for e in store.entries()) == [0, 4000]
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_conversation_keeps_latest_and_last_after_user_checkpoint():
    pool, store = make(pages=64, host=8)
    seq = live_seq(pool, 1000)
    # turn 1 (user), turn 2 (tool result), turn 3 (tool result), turn 4 (tool result)
    for n, after_user in ((100, True), (200, False), (300, False), (400, False)):
        store.capture(toks(n), seq, 0, "prompt_checkpoint", "interactive", after_user)
        round_applied(store)
    assert sorted(e.num_tokens for e in store.entries()) == [100, 400]
    store.capture(toks(500), seq, 0, "prompt_checkpoint", "interactive", True)  # a new user turn
    round_applied(store)
    assert sorted(e.num_tokens for e in store.entries()) == [100, 500]  # 100: the previous user turn's
    store.capture(toks(600), seq, 0, "prompt_checkpoint", "interactive", False)  # a tool result
    round_applied(store)
    assert sorted(e.num_tokens for e in store.entries()) == [500, 600]
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_conversation_resuming_each_turn_keeps_at_most_two_checkpoints():
    """Each turn resumes from the previous checkpoint (pinning it) and captures the next one:
    the checkpoint it read is released once the round is applied, not kept as a third."""
    pool, store = make(pages=64, host=8)
    seq = live_seq(pool, 1200)
    turns = [(100, True)] + [(100 * (i + 2), i % 3 == 2) for i in range(9)]
    for n, after_user in turns:
        hit = store.lookup(toks(n + 5))
        assert hit is None or hit.num_tokens < n
        store.capture(toks(n), seq, 0, "prompt_checkpoint", "interactive", after_user)
        round_applied(store)
        assert len(store) <= 2, sorted(e.num_tokens for e in store.entries())
    latest = turns[-1][0]
    previous_user = max(n for n, after_user in turns if after_user and n < latest)
    assert sorted(e.num_tokens for e in store.entries()) == [previous_user, latest]
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_a_checkpoint_past_its_conversations_budget_gives_its_slot_to_the_next_one():
    """Two conversations fill the four slots with two checkpoints each: a new tool-result turn of one
    takes the slot of the checkpoint it puts past the budget, not one of the other conversation's."""
    pool, store = make(pages=64, host=4)
    seq = live_seq(pool, 1000)
    for base in (0, 5000):
        for n, after_user in ((100, True), (200, False)):
            store.capture(toks(n, base), seq, 0, "prompt_checkpoint", "interactive", after_user)
            round_applied(store)
    assert store.slots.num_free == 0
    # conversation 0's entries are the least recently used: before, the new capture pushed one out
    store.capture(toks(300, 5000), seq, 0, "prompt_checkpoint", "interactive", False)  # conversation 1 goes on
    round_applied(store)
    assert sorted(e.tokens[0] + e.num_tokens for e in store.entries()) == [100, 200, 5100, 5300]
    assert store.captures_skipped == 0
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_a_request_of_a_cache_family_keeps_that_familys_entries_over_idle_ones():
    pool, store = make(host=2)
    seq = live_seq(pool, 400)
    store.capture(toks(70), seq, 0, "prompt_checkpoint", "interactive", True, family="fam-a")
    store.capture(toks(80, 1000), seq, 0, "prompt_checkpoint", "interactive", True, family="fam-b")
    round_applied(store)
    # fam-a's entry is the least recently used; a request of fam-a arriving ranks it as used now
    assert store.touch_family("fam-a") == 1 and store.touch_family("fam-none") == 0
    assert store.touch_family(None) == 0
    store.capture(toks(90, 2000), seq, 0, "prompt_checkpoint", "interactive", True)
    assert sorted(e.tokens[0] for e in store.entries()) == [0, 2000]  # fam-b's idle entry gave way
    round_applied(store)
    # without the touch the least recently used goes (fam-a's, now older than the family-less one)
    store.capture(toks(95, 4000), seq, 0, "prompt_checkpoint", "interactive", True)
    assert sorted(e.tokens[0] for e in store.entries()) == [2000, 4000]
    assert store.stats()["reuse_family_touches_total"] == 1
    # a family is a hint for ranking only: lookups stay by content, whatever the family
    assert store.lookup(toks(91, 2000)).num_tokens == 90
    seq.release()
    store.release_all()
    pool.integrity_check()


def test_reclaim_releases_lowest_ranked_until_room_and_skips_pinned():
    pool, store = make(pages=8, host=4)
    a = live_seq(pool, 64, "a")  # page 0
    b = live_seq(pool, 128, "b")  # pages 1, 2
    store.capture(toks(64), a, 0, "retained_prefix", "agent", False)
    store.capture(toks(100, 500), b, 1, "prompt_checkpoint", "interactive", True)  # shares 1, copies 2 -> 3
    a.release()
    b.release()
    assert pool.num_free == 8 - 3
    assert store.reclaim_pages(8) == 0  # both pinned this round
    round_applied(store)
    assert store.reclaim_pages(6) == 1
    assert [e.request_class for e in store.entries()] == ["interactive"]
    assert store.reclaim_pages(8) == 1 and len(store) == 0
    assert pool.num_free == 8
    pool.integrity_check()


def test_a_capture_short_of_a_page_releases_only_entries_that_free_one():
    """The pool is full and a capture needs a page for its partial last one: an entry whose pages a running
    sequence shares frees nothing and stays (it was released for nothing, lowest-ranked first), one holding
    a page of its own goes; with none such the capture is skipped and every entry kept."""
    pool, store = make(pages=4, host=4)
    live = live_seq(pool, 128, "live")  # pages 0, 1
    store.capture(toks(128), live, 0, "retained_prefix", "agent", False)  # shares both: frees nothing
    other = live_seq(pool, 64, "other")  # page 2
    store.capture(toks(40, 500), other, 1, "prompt_checkpoint", "interactive", True)  # copies 2 -> 3
    round_applied(store)
    other.release()
    filler = live_seq(pool, 64, "filler")  # page 2 again: nothing free
    assert pool.num_free == 0
    order = store.capture(toks(100, 900), live, 0, "prompt_checkpoint", "interactive", True)
    assert order is not None and order.page_copies == ((1, 3),)
    assert sorted(len(e.tokens) for e in store.entries()) == [100, 128]  # the agent's entry stayed
    live.release()
    filler.release()
    store.release_all()
    assert pool.num_free == 4
    pool.integrity_check()

    pool, store = make(pages=2, host=4)
    live = live_seq(pool, 128, "live")
    store.capture(toks(128), live, 0, "retained_prefix", "agent", False)
    round_applied(store)
    assert store.capture(toks(90, 700), live, 0, "prompt_checkpoint", "interactive", True) is None
    assert store.captures_skipped == 1 and len(store) == 1
    live.release()
    store.release_all()
    assert pool.num_free == 2
    pool.integrity_check()


def test_stamp_mismatch_is_refused_before_anything_moves():
    pool, store = make(stamp="model-a:bf16:drafter=0")
    seq = live_seq(pool, 100)
    store.capture(toks(90), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    refs = [pool.refcount(p) for p in range(4)]
    store.stamp = "model-b:bf16:drafter=0"
    assert store.lookup(toks(95)) is None
    assert store.stamp_refusals == 1
    assert [pool.refcount(p) for p in range(4)] == refs
    store.stamp = "model-a:bf16:drafter=0"
    assert store.lookup(toks(95)).num_tokens == 90
    seq.release()
    store.release_all()


def test_an_entry_made_without_the_drafter_is_refused_with_it():
    """--speculative-tokens changes only the stamp's drafter bit: still refused before anything moves."""
    pool, store = make(stamp="model-a:bf16:drafter=0")
    seq = live_seq(pool, 100)
    store.capture(toks(90), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    refs = [pool.refcount(p) for p in range(4)]
    store.stamp = "model-a:bf16:drafter=1"
    assert store.lookup(toks(95)) is None
    assert store.stamp_refusals == 1
    assert [pool.refcount(p) for p in range(4)] == refs
    seq.release()
    store.release_all()


def test_disabled_store_does_nothing():
    pool, store = make(enabled=False)
    seq = live_seq(pool, 100)
    assert store.capture(toks(90), seq, 0, "prompt_checkpoint", "interactive", True) is None
    assert store.lookup(toks(95)) is None
    seq.release()
    assert pool.num_free == pool.num_pages


def test_zero_slots_disables_reuse():
    pool, store = make(host=0)
    assert not store.enabled


@pytest.mark.parametrize("n", [1, 63, 64, 65, 128])
def test_page_chain_length(n):
    assert len(hashing.page_chain(list(range(n)), 64)) == 1 + n // 64


def test_page_chain_names_each_page_in_its_place():
    """h_k depends on which page comes where: swapped pages, or the same page after another one, hash apart."""
    a, b, c = list(range(64)), list(range(100, 164)), list(range(200, 264))
    ab, ba, cb = (hashing.page_chain(x, 64) for x in (a + b, b + a, c + b))
    assert ab[2] != ba[2]
    assert ab[2] != cb[2]
    assert len({ab[1], ba[1], cb[1]}) == 3 and ab[1] == hashing.page_chain(a, 64)[1]


class FakeTier(NullTierPort):
    """Stands in for tierd: remembers what was demoted, restores it on request, says where each key is.

    ``where``: tierd's answers to a lookup (default: the tier each held key is in; what
    it answers is where the keys are from then on); ``read_from``: the tier a restore
    reports (default: the one the key is held in)."""

    def __init__(self, tier="ram", fail_fetch=False, where=None, read_from=None):
        self.tier, self.fail_fetch, self.read_from = tier, fail_fetch, read_from
        self.where = where
        self.demoted, self.fetched, self.skipped = [], [], []
        self.last_used: dict[tuple, float | None] = {}  # tokens -> last_used sent with the demote
        self.held: dict[str, str] = {}  # key -> tier
        self.session = 1

    def hold(self, record):
        """An entry tierd holds (in ``record.tier``) that the engine knows of."""
        self.held[record.key] = record.tier
        return record

    def demote_retained(self, tokens, pages, slot, request_class, last_used=None):
        self.demoted.append((tokens, tuple(pages), slot))
        self.last_used[tokens] = last_used
        self.held[content_key(tokens)] = self.tier
        return self.tier

    def restore_retained(self, key, pages, slot, skip=0):
        self.fetched.append((key, tuple(pages), slot))
        self.skipped.append(skip)
        return None if self.fail_fetch else (self.read_from or self.held.get(key))

    def locate(self, keys):
        if self.where is None:
            return {k: self.held.get(k) for k in keys}
        answer = self.where(keys)
        for k, t in (answer or {}).items():
            if t is not None:
                self.held[k] = t
        return answer


def with_lower(tier, floors=None, pages=32, host=4):
    """A pool and a store whose lower tiers are ``tier``."""
    return make(pages=pages, host=host, tiers=tier, restore_floors=floors or {"ram": 64, "disk": 256})


def lower_record(key: str, n: int, tier: str):
    """A lower-tier record of an interactive checkpoint over ``toks(n)``."""
    from ignis.engine.reuse.lower_index import LowerRecord

    return LowerRecord(key, toks(n), "prompt_checkpoint", "interactive", True, tier)


def test_lazy_demotion_on_reclaim_then_restore_past_the_floor():
    tier = FakeTier()
    pool, store = with_lower(tier, pages=8)
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    seq.release()
    round_applied(store)
    assert tier.demoted == []  # nothing moves down while the device has room
    assert store.reclaim_pages(8) == 1
    assert len(tier.demoted) == 1 and tier.demoted[0][0] == toks(200)
    assert len(store) == 0 and len(store.lower) == 1 and pool.num_free == 8
    hit = store.lookup(toks(230))
    assert (hit.num_tokens, hit.tier) == (200, "kv_ram")
    assert tier.fetched[0][0] == content_key(toks(200)) and len(tier.fetched[0][1]) == 4
    assert len(store) == 1  # a device entry again
    round_applied(store)
    store.release_all()
    assert pool.num_free == 8 and len(store.lower) == 0
    pool.integrity_check()


def test_a_restore_shares_the_device_matchs_whole_pages_and_reads_only_the_rest():
    """A system block retained on the device, a conversation over it in KV-RAM: the restored entry holds
    the block's pages in place (no second copy in the pool) and tierd is asked for the pages after them."""
    tier = FakeTier()
    pool, store = with_lower(tier, pages=16)
    seq = live_seq(pool, 130)
    store.capture(toks(130), seq, 0, "retained_prefix", "interactive", False)
    seq.release()
    round_applied(store)
    (block,) = store.entries()
    store.lower.add(tier.hold(lower_record("c" * 32, 400, "ram")))
    free = pool.num_free
    hit = store.lookup(toks(430))
    assert (hit.num_tokens, hit.tier) == (400, "kv_ram")
    assert tier.skipped == [2]  # 130 tokens: two whole pages shared, the third (partial) is read
    assert len(tier.fetched[0][1]) == pool.pages_for(400) - 2
    assert list(hit.pages[:2]) == list(block.pages.pages[:2])
    assert free - pool.num_free == pool.pages_for(400) - 2
    round_applied(store)
    store.release_all()
    assert pool.num_free == 16
    pool.integrity_check()


def test_a_restore_without_room_is_skipped_and_named_no_room():
    """Every page held by a running sequence and nothing landing: the request computes, and says why."""
    tier = FakeTier()
    pool, store = with_lower(tier, pages=8)
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    running = live_seq(pool, 6 * 64)  # 6 of 8 pages: the 4 the restore needs are not there
    assert store.lookup(toks(260)) is None and tier.fetched == []
    assert store.fates.of(toks(200)) == "no_room"
    running.release()
    hit = store.lookup(toks(260))  # room again: restored
    assert (hit.num_tokens, hit.tier) == (200, "kv_ram")
    round_applied(store)
    store.release_all()
    pool.integrity_check()


def test_restore_floor_and_ties_go_to_the_tier_above():
    tier = FakeTier()
    pool, store = with_lower(tier, {"ram": 64, "disk": 256})
    seq = live_seq(pool, 300)
    store.capture(toks(150), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    hit = store.lookup(toks(260))
    assert (hit.num_tokens, hit.tier) == (150, "device")  # 50 more tokens < the 64-token floor
    assert tier.fetched == []
    round_applied(store)
    store.lower.add(tier.hold(lower_record("b" * 32, 214, "ram")))
    hit = store.lookup(toks(260))
    assert (hit.num_tokens, hit.tier) == (214, "kv_ram")  # exactly the floor: taken
    seq.release()
    round_applied(store)
    store.release_all()
    pool.integrity_check()


def test_tierd_is_not_asked_about_matches_no_floor_would_take():
    """A request waits for tierd's answer at the head of the queue: when every match is shorter than the
    device match plus the lower floor, tierd is not asked (nothing would be restored)."""
    asked = []
    tier = FakeTier(where=lambda keys: asked.append(list(keys)) or {k: "ram" for k in keys})
    pool, store = with_lower(tier, {"ram": 64, "disk": 256})
    store.lower.add(tier.hold(lower_record("a" * 32, 63, "ram")))
    store.lower.add(tier.hold(lower_record("b" * 32, 40, "disk")))
    assert store.lookup(toks(100)) is None and asked == []
    assert store.fates.of(toks(63)) == store.fates.of(toks(40)) == "below_floor"  # the request's shortfall
    store.lower.add(tier.hold(lower_record("c" * 32, 64, "ram")))  # exactly the floor: worth asking
    hit = store.lookup(toks(100))
    assert sorted(asked[0]) == ["a" * 32, "b" * 32, "c" * 32] and (hit.num_tokens, hit.tier) == (64, "kv_ram")
    round_applied(store)
    store.release_all()
    pool.integrity_check()


def test_lower_tier_candidates_are_verified_token_by_token():
    """A record tierd holds is restored only for a prompt whose first tokens are its tokens: another prompt of
    the same length (or longer) moves nothing and resumes nowhere."""
    tier = FakeTier()
    pool, store = with_lower(tier, {"ram": 1, "disk": 1})
    store.lower.add(tier.hold(lower_record("d" * 32, 200, "ram")))
    assert store.lookup(toks(230, base=7)) is None
    assert store.lookup(toks(200)[:199] + (9999,) + toks(30, 500)) is None  # only the record's last token differs
    assert tier.fetched == [] and len(store) == 0
    hit = store.lookup(toks(230))
    assert (hit.num_tokens, hit.tier) == (200, "kv_ram") and len(tier.fetched) == 1
    round_applied(store)
    store.release_all()
    assert pool.num_free == pool.num_pages
    pool.integrity_check()


def test_a_restore_that_misses_falls_back_to_the_device_match():
    tier = FakeTier(fail_fetch=True)
    pool, store = with_lower(tier, {"ram": 1, "disk": 1})
    seq = live_seq(pool, 300)
    store.capture(toks(100), seq, 0, "prompt_checkpoint", "interactive", True)
    round_applied(store)
    store.lower.add(tier.hold(lower_record("c" * 32, 250, "disk")))
    hit = store.lookup(toks(260))
    assert (hit.num_tokens, hit.tier) == (100, "device")
    assert len(store.lower) == 0  # the missing record is forgotten
    seq.release()
    round_applied(store)
    store.release_all()
    assert pool.num_free == pool.num_pages and store.slots.num_free == 4
    pool.integrity_check()


def test_floors_are_applied_per_tier_and_a_disk_match_must_beat_kv_ram_too():
    from ignis.engine.reuse.lower_index import LowerIndex

    index = LowerIndex({"ram": 64, "disk": 256})

    def rec(n, tier):
        return lower_record(f"{tier}{n}", n, tier)

    ram, disk_short, disk_long = rec(200, "ram"), rec(300, "disk"), rec(456, "disk")
    # the longest match (disk) misses its floor: KV-RAM's still passes its own
    assert index.choose([ram, disk_short], device_match=100) is ram
    # KV-disk is measured against the better of the device and KV-RAM: 456 >= 200 + 256
    assert index.choose([ram, disk_long], device_match=100) is disk_long
    assert index.choose([rec(455, "disk"), ram], device_match=100) is ram
    # a KV-RAM match that misses its own floor still raises the bar for KV-disk
    assert index.choose([rec(150, "ram"), rec(400, "disk")], device_match=100) is None
    assert index.choose([rec(150, "ram"), rec(406, "disk")], device_match=100).tier == "disk"
    # nothing clears a floor: stay on the device
    assert index.choose([rec(163, "ram"), rec(355, "disk")], device_match=100) is None
    # a tie between tiers goes to the one above, whatever the floors
    flat = LowerIndex({"ram": 0, "disk": 0})
    same_ram, same_disk = rec(200, "ram"), rec(200, "disk")
    assert flat.choose([same_disk, same_ram], device_match=100) is same_ram
    assert flat.choose([rec(100, "ram")], device_match=100) is None


def test_the_lower_index_is_bounded_and_keeps_what_was_used_last():
    from ignis.engine.reuse.lower_index import LowerIndex

    index = LowerIndex({"ram": 0, "disk": 0}, limit=3)
    for i in range(3):
        index.add(lower_record(f"k{i}", 70 + i, "ram"))
    index.move("k0", "disk")  # tierd said where k0 is: it counts as used
    index.add(lower_record("k3", 80, "ram"))
    index.add(lower_record("k4", 81, "ram"))
    assert len(index) == 3 and index.forgotten == 2
    kept = [r.key for r in index.matches(toks(200), 200)]
    assert sorted(kept) == ["k0", "k3", "k4"]  # k1 and k2 were the oldest
    # tokens are kept as int32 and still match token by token
    assert sorted(r.key for r in index.matches(toks(80) + (999,), 81)) == ["k0", "k3"]
    assert [r.key for r in index.matches(toks(75) + (999,) + toks(20, 76), 96)] == ["k0"]  # differs at 75


def test_the_lower_index_bounds_the_tokens_its_records_keep():
    from ignis.engine.reuse.lower_index import LowerIndex

    index = LowerIndex({"ram": 0, "disk": 0}, token_limit=250)
    for i in range(4):
        index.add(lower_record(f"k{i}", 100 + i, "ram"))
    assert [r.key for r in index.matches(toks(200), 200)] == ["k2", "k3"] and index.tokens_held == 205
    index.forget("k2")
    assert index.tokens_held == 103 and index.forgotten == 2
    index.add(lower_record("huge", 300, "ram"))  # larger than the bound alone: kept, as the newest
    assert [r.key for r in index.matches(toks(400), 400)] == ["huge"] and index.tokens_held == 300
    index.clear()
    assert index.tokens_held == 0 and len(index) == 0


def test_lower_matches_need_every_token_not_only_the_last():
    from ignis.engine.reuse.lower_index import LowerIndex

    index = LowerIndex({"ram": 0, "disk": 0})
    index.add(lower_record("k", 50, "ram"))
    prompt = toks(60)
    assert [r.key for r in index.matches(prompt, 59)] == ["k"]
    changed = prompt[:10] + (prompt[10] + 1,) + prompt[11:]  # same last token of the record, one earlier differs
    assert index.matches(changed, 59) == [] and index.matches(prompt[:50], 50) == [index._records["k"]]
    assert index.matches(prompt[:49], 49) == []


def test_the_engine_asks_tierd_where_its_matches_are_before_it_picks():
    asked = []
    where = {"a" * 32: "disk", "b" * 32: None}

    def locate(keys):
        asked.append(sorted(keys))
        return {k: where.get(k, "ram") for k in keys}

    tier = FakeTier(where=locate)
    pool, store = with_lower(tier, {"ram": 64, "disk": 256})
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    store.lower.add(tier.hold(lower_record("b" * 32, 240, "ram")))
    # known as KV-RAM, but tierd has spilled "a" to disk (floor 256) and dropped "b": no restore
    assert store.lookup(toks(260)) is None
    assert asked == [["a" * 32, "b" * 32]] and tier.fetched == []
    assert len(store.lower) == 1 and store.lower.matches(toks(260), 259)[0].tier == "disk"
    round_applied(store)
    # a match past the disk floor is restored, and the hit names the tier it was read from
    store.lower.add(tier.hold(lower_record("c" * 32, 300, "ram")))
    where["c" * 32] = "disk"
    hit = store.lookup(toks(310))
    assert (hit.num_tokens, hit.tier) == (300, "kv_disk")
    round_applied(store)
    store.release_all()
    pool.integrity_check()


def test_lower_tiers_are_skipped_while_tierd_cannot_say_where_entries_are():
    tier = FakeTier(where=lambda keys: None)
    pool, store = with_lower(tier, {"ram": 1, "disk": 1})
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    assert store.lookup(toks(260)) is None and tier.fetched == []
    assert len(store.lower) == 1  # not forgotten: tierd may be back next time
    assert store.fates.of(toks(200)) == "tier_failed"  # the request's done line says why it computed
    store.release_all()


def test_the_hit_names_the_tier_tierd_read_from():
    tier = FakeTier(read_from="disk")  # spilled after the engine last asked
    pool, store = with_lower(tier, {"ram": 1, "disk": 1})
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    hit = store.lookup(toks(260))
    assert (hit.num_tokens, hit.tier) == (200, "kv_disk")
    round_applied(store)
    store.release_all()
    pool.integrity_check()


def test_a_short_kv_ram_match_still_counts_against_a_disk_match():
    tier = FakeTier(where=lambda keys: {k: ("ram" if k == "r" * 32 else "disk") for k in keys})
    pool, store = with_lower(tier, {"ram": 64, "disk": 256})
    store.lower.add(tier.hold(lower_record("r" * 32, 50, "ram")))
    store.lower.add(tier.hold(lower_record("d" * 32, 260, "disk")))
    assert store.lookup(toks(300)) is None  # 260 < 50 + 256: not worth a disk read
    assert tier.fetched == []
    store.release_all()


def test_a_new_hello_empties_what_the_engine_knew_of_tierd():
    tier = FakeTier()
    pool, store = with_lower(tier, {"ram": 1, "disk": 1})
    store.lower.add(tier.hold(lower_record("a" * 32, 200, "ram")))
    assert len(store.lower) == 1
    tier.session += 1  # tierd restarted and the engine said hello again: it holds nothing of ours
    tier.held.clear()
    assert len(store.lower) == 0 and store.stats()["retained_lower_entries"] == 0
    assert store.lookup(toks(260)) is None and tier.fetched == []


def test_an_entry_demoted_through_a_new_hello_is_known_below():
    class HelloOnDemote(FakeTier):
        def demote_retained(self, tokens, pages, slot, request_class, last_used=None):
            self.session += 1  # tierd had restarted: the port said hello again before the copy
            return super().demote_retained(tokens, pages, slot, request_class, last_used)

    tier = HelloOnDemote()
    pool, store = with_lower(tier, pages=8)
    store.lower.add(lower_record("x" * 32, 100, "ram"))  # of the session before
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    seq.release()
    round_applied(store)
    assert store.reclaim_pages(8) == 1
    assert [r.key for r in store.lower.matches(toks(230), 229)] == [content_key(toks(200))]
    store.release_all()
    pool.integrity_check()


def test_without_lower_tiers_nothing_moves_down():
    pool, store = make(pages=8, host=4)
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    seq.release()
    round_applied(store)
    assert store.reclaim_pages(8) == 1
    assert store.demotions == 0 and len(store.lower) == 0
    assert store.lookup(toks(230)) is None
    pool.integrity_check()


def test_remembered_page_chains_equal_fresh_ones():
    """Chains are remembered by the tuple they were made of (a waiting prompt is hashed every round) and a
    prefix of a remembered tuple reads its chain: every answer equals a fresh computation."""
    from ignis.engine.reuse import hashing

    def fresh(tokens, pt, limit=None):
        full = len(tokens) // pt if limit is None else min(len(tokens) // pt, limit)
        return hashing._chain_of(tokens, pt, full)

    prompt = toks(1000, 7)
    assert hashing.page_chain(prompt, 64) == fresh(prompt, 64)
    assert hashing.page_chain(prompt, 64, 5) == fresh(prompt, 64, 5)  # remembered, cut at the limit
    assert hashing.page_chain(prompt, 16) == fresh(prompt, 16)  # another page size: not the same chain
    assert hashing.page_chain(prompt[:300], 64) == fresh(prompt[:300], 64)  # a prefix of a remembered tuple
    other = prompt[:300] + (99999,) * 700  # same length as the prompt, equal only up to 300
    assert hashing.page_chain(other, 64) == fresh(other, 64) != fresh(prompt, 64)
    assert hashing.page_chain(list(prompt), 64) == fresh(prompt, 64)  # lists are never remembered
    got = hashing.page_chain(prompt, 64)
    got.append(b"x")  # a caller's list is its own
    assert hashing.page_chain(prompt, 64) == fresh(prompt, 64)
    assert len(hashing._memo) <= hashing.MEMO_CHAINS
