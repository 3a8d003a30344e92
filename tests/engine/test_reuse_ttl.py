"""The interactive TTL counts from an entry's last use, not from its demotion.

tierd ages a retained interactive entry into the agent class ``ttl`` seconds
after the ``last_used`` its demote carries. The engine demotes lazily, long
after the entry may last have been used, so it sends the wall-clock time of
the entry's capture or last hit, never the time of the demotion.
"""

from __future__ import annotations

from tests.engine.test_reuse_store import FakeTier, live_seq, round_applied, toks
from ignis.engine.page_pool import PagePool
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.store import RetainedStore


def test_demote_carries_the_time_of_the_last_hit_not_of_the_demotion():
    now = [1000.0]
    tier = FakeTier()
    pool = PagePool(8)
    store = RetainedStore(pool, SlotPool(0, 4), tiers=tier, restore_floors={"ram": 64, "disk": 256},
                          clock=lambda: now[0])
    seq = live_seq(pool, 200)
    store.capture(toks(200), seq, 0, "prompt_checkpoint", "interactive", True)
    seq.release()
    round_applied(store)
    now[0] = 1100.0
    assert store.lookup(toks(230)).num_tokens == 200  # a hit: its last use
    round_applied(store)
    now[0] = 1900.0  # idle 800 s on the device, then the room is needed
    assert store.reclaim_pages(8) == 1
    assert tier.last_used == {toks(200): 1100.0}
    store.release_all()
    pool.integrity_check()


def test_a_capture_of_retained_tokens_is_a_use():
    now = [50.0]
    tier = FakeTier()
    pool = PagePool(8)
    store = RetainedStore(pool, SlotPool(0, 4), tiers=tier, clock=lambda: now[0])
    seq = live_seq(pool, 130)
    store.capture(toks(130), seq, 0, "retained_prefix", "interactive", False)
    round_applied(store)
    now[0] = 70.0
    assert store.capture(toks(130), seq, 1, "retained_prefix", "interactive", False) is None  # refreshes
    seq.release()
    round_applied(store)
    now[0] = 500.0
    store.reclaim_pages(8)
    assert tier.last_used == {toks(130): 70.0}
