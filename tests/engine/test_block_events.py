"""The block ledger: stores and removals per medium, counted by holder, as chain tails with their parent."""

from __future__ import annotations

import pytest

from ignis.engine.reuse.block_events import (
    AllBlocksCleared,
    BlockLedger,
    BlockRemoved,
    BlockStored,
    block_id,
)
from ignis.engine.reuse.hashing import page_chain

PT = 4


def ids(tokens, pages):
    return tuple(block_id(h) for h in page_chain(tokens, PT)[1:pages + 1])


@pytest.fixture
def ledger():
    events = []
    return BlockLedger(PT, events.append), events


def test_first_holder_stores_and_last_removes(ledger):
    led, events = ledger
    t = tuple(range(10))  # two full pages, a partial third never a block
    led.held(t, "GPU")
    assert events == [BlockStored(ids(t, 2), None, t[:8], PT, "GPU")]
    led.held(t, "GPU")
    assert len(events) == 1  # a second holder stores nothing new
    led.dropped(t, "GPU")
    assert len(events) == 1
    led.dropped(t, "GPU")
    assert events[-1] == BlockRemoved(ids(t, 2), "GPU")
    assert led.blocks("GPU") == 0


def test_a_longer_entry_stores_only_its_tail_with_the_parent(ledger):
    led, events = ledger
    long = tuple(range(100, 116))  # four pages
    led.held(long[:8], "GPU")
    led.held(long, "GPU")
    chain = ids(long, 4)
    assert events[1] == BlockStored(chain[2:], chain[1], long[8:16], PT, "GPU")
    led.dropped(long, "GPU")  # the shorter entry still holds the first two pages
    assert events[2] == BlockRemoved(chain[2:], "GPU")
    assert led.blocks("GPU") == 2


def test_media_are_counted_apart_and_a_move_is_store_then_remove(ledger):
    led, events = ledger
    t = tuple(range(8))
    led.held(t, "GPU")
    led.moved(t, "GPU", "CPU")
    assert events[1:] == [BlockStored(ids(t, 2), None, t, PT, "CPU"), BlockRemoved(ids(t, 2), "GPU")]
    led.moved(t, "CPU", "CPU")
    assert len(events) == 3
    assert (led.blocks("GPU"), led.blocks("CPU")) == (0, 2)


def test_cleared_forgets_everything_and_later_drops_are_silent(ledger):
    led, events = ledger
    t = tuple(range(12))
    led.held(t, "GPU")
    led.held(t, "DISK")
    led.cleared()
    assert events[-1] == AllBlocksCleared()
    led.dropped(t, "GPU")
    assert events[-1] == AllBlocksCleared()
    assert led.blocks("GPU") == led.blocks("DISK") == 0


def test_short_entries_have_no_blocks(ledger):
    led, events = ledger
    led.held((1, 2, 3), "GPU")
    led.dropped((1, 2, 3), "GPU")
    assert events == []


def test_block_id_is_the_first_eight_bytes_big_endian_below_two_to_the_63():
    assert block_id(bytes(range(16))) == int.from_bytes(bytes(range(8)), "big")
    assert block_id(b"\xff" * 16) == (1 << 63) - 1  # fits a signed 64-bit integer
