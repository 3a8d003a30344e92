"""The interactive TTL counts from an entry's last use: a restore (a hit) refreshes it.

TierStore in-process with an injected clock and an arena of two entries, no
KV-disk: the third retained entry makes room by discarding the lowest-ranked
one, so which entry goes says how each one ranked.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest

from ignis.shared.tier_wire import Demote, Demoted, Restore, Restored, UnitLayout
from ignis.tierd.arena import Arena
from ignis.tierd.memory_map import EngineMemory
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.ranking import rank_key
from ignis.tierd.store import TierStore
from tests.tierd.fake_engine import PAGE_BYTES, STAMP, entry_blocks, key, make_blocks

TTL = 300.0


def refs(page: int, lane: int) -> tuple:
    return (("kv", page), ("ssm", lane), ("conv", lane))


class Store:
    def __init__(self, arena_blocks: int):
        self.now = 1000.0
        self.blocks = make_blocks()
        for i, b in enumerate(self.blocks.values()):
            b.array()[...] = np.random.default_rng(i).integers(0, 256, b.array().shape, dtype=np.uint8)
        self.memory = EngineMemory(tuple(b.descriptor() for b in self.blocks.values()), UnitLayout())
        self.posted: queue.Queue = queue.Queue()
        self.replies: list = []
        self.store = TierStore(arena=Arena(arena_blocks * PAGE_BYTES), block_bytes=PAGE_BYTES, memory=self.memory,
                               disk=None, stamp=STAMP, ttl=TTL, metrics=TierdMetrics("t"), post=self.posted.put,
                               reply=lambda peer, m: self.replies.append(m), again=None, clock=lambda: self.now)
        self.req = 0

    def demote(self, n: int, src: tuple, request_class: str, last_used: float):
        self.req += 1
        msg = Demote(self.req, key(n), STAMP, src, kind="retained", request_class=request_class, last_used=last_used)
        self.store.demote(b"peer", msg, self.memory.resolve(msg.source))
        return self.settle()

    def restore(self, n: int, dest: tuple):
        self.req += 1
        msg = Restore(self.req, key(n), STAMP, dest)
        self.store.restore(b"peer", msg, self.memory.resolve(msg.dest))
        return self.settle()

    def settle(self) -> list:
        while self.store.in_flight or not self.posted.empty():
            self.posted.get(timeout=5)()
        out, self.replies = self.replies, []
        self.store.check()
        return out

    def interactive(self, n: int) -> bool:
        e = self.store.entries[key(n)]
        return rank_key(self.store._rank(e), self.now, TTL)[1] == 1

    def close(self):
        self.store.close()
        for b in self.blocks.values():
            b.close()


@pytest.fixture
def s():
    store = Store(arena_blocks=2 * entry_blocks(1))
    yield store
    store.close()


def test_a_restored_interactive_entry_does_not_age_into_the_agent_class(s):
    assert [type(m) for m in s.demote(1, refs(1, 0), "interactive", last_used=1000.0)] == [Demoted]
    assert [type(m) for m in s.demote(2, refs(2, 1), "agent", last_used=1200.0)] == [Demoted]
    s.now = 1390.0  # idle 390 s since demotion: past the TTL, then a hit
    assert not s.interactive(1)
    assert [type(m) for m in s.restore(1, refs(5, 2))] == [Restored]
    s.now = 1500.0  # 500 s after demotion, 110 s after its last use
    assert s.interactive(1)
    # room for a third entry: the agent's goes, the recently used interactive one stays
    assert [type(m) for m in s.demote(3, refs(3, 3), "interactive", last_used=1500.0)] == [Demoted]
    assert sorted(s.store.entries) == sorted([key(1), key(3)])


def test_an_idle_interactive_entry_ages_into_the_agent_class(s):
    s.demote(1, refs(1, 0), "interactive", last_used=1000.0)
    s.demote(2, refs(2, 1), "agent", last_used=1200.0)
    s.now = 1500.0  # idle past the TTL, never restored: it ranks as an agent's, and is older
    assert not s.interactive(1)
    s.demote(3, refs(3, 3), "interactive", last_used=1500.0)
    assert sorted(s.store.entries) == sorted([key(2), key(3)])


def test_the_ttl_counts_from_the_last_use_the_demote_carries_not_from_its_arrival(s):
    """The engine demotes lazily: an interactive entry last used more than the TTL before its demote ranks
    as an agent's from its arrival, and gives way before an agent entry used since."""
    s.now = 2000.0
    s.demote(1, refs(1, 0), "interactive", last_used=1000.0)  # last used 1000 s ago, demoted now
    s.demote(2, refs(2, 1), "agent", last_used=1900.0)
    assert not s.interactive(1)
    s.demote(3, refs(3, 3), "interactive", last_used=2000.0)
    assert sorted(s.store.entries) == sorted([key(2), key(3)])
