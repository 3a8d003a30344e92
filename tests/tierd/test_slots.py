"""The slot state machine: every legal edge works, every other pair raises, and entries report their tier."""

from __future__ import annotations

import itertools

import pytest

from ignis.tierd.slots import BUSY, HOLDS_BYTES, TRANSITIONS, Entry, IllegalTransition, Slot, SlotState

S = SlotState
LEGAL = {
    (S.FREE, S.RESERVED), (S.RESERVED, S.FILLING), (S.RESERVED, S.FREE), (S.FILLING, S.RESIDENT),
    (S.FILLING, S.FREE), (S.RESIDENT, S.READING), (S.READING, S.RESIDENT), (S.RESIDENT, S.SPILLING),
    (S.SPILLING, S.FREE), (S.SPILLING, S.RESIDENT), (S.RESIDENT, S.FREE),
}
PATHS = {  # how to bring a fresh slot to each state along legal edges
    S.FREE: [], S.RESERVED: [S.RESERVED], S.FILLING: [S.RESERVED, S.FILLING],
    S.RESIDENT: [S.RESERVED, S.FILLING, S.RESIDENT], S.READING: [S.RESERVED, S.FILLING, S.RESIDENT, S.READING],
    S.SPILLING: [S.RESERVED, S.FILLING, S.RESIDENT, S.SPILLING],
}


def slot_in(state: SlotState, tier: str = "ram") -> Slot:
    slot = Slot(tier)
    for step in PATHS[state]:
        slot.move(step)
    assert slot.state is state
    return slot


def test_the_table_is_exactly_the_documented_edges():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL


@pytest.mark.parametrize("src,dst", sorted(LEGAL, key=str))
def test_every_legal_transition(src, dst):
    slot = slot_in(src)
    slot.move(dst)
    assert slot.state is dst


@pytest.mark.parametrize("src,dst", sorted(set(itertools.product(S, S)) - LEGAL, key=str))
def test_every_illegal_transition_raises_and_leaves_the_state(src, dst):
    slot = slot_in(src)
    with pytest.raises(IllegalTransition, match=f"{src.name} -> {dst.name}"):
        slot.move(dst)
    assert slot.state is src


def test_a_disk_slot_never_spills_but_walks_the_rest():
    slot = slot_in(S.RESIDENT, "disk")
    with pytest.raises(IllegalTransition, match="last tier"):
        slot.move(S.SPILLING)
    slot.move(S.READING)
    slot.move(S.RESIDENT)
    slot.move(S.FREE)
    with pytest.raises(ValueError):
        Slot("vram")


def test_busy_and_holding_states():
    assert BUSY == {S.RESERVED, S.FILLING, S.READING, S.SPILLING}
    assert HOLDS_BYTES == {S.RESIDENT, S.READING, S.SPILLING}
    for state in S:
        slot = slot_in(state)
        assert slot.busy == (state in BUSY) and slot.holds_bytes == (state in HOLDS_BYTES)


def test_entry_tier_follows_its_slots_through_a_spill():
    e = Entry("ab" * 8, ("kv", "ssm", "conv"), 100, "live", "agent", 1.0, 1)
    assert e.busy and e.tier is None  # accepted, first copy not done
    for step in PATHS[S.RESIDENT]:
        e.arena.move(step)
    e.pending = False
    assert not e.busy and e.tier == "ram" and e.idle_in == "ram"
    e.arena.move(S.SPILLING)
    e.disk.move(S.RESERVED)
    e.disk.move(S.FILLING)
    assert e.busy and e.tier == "ram" and e.idle_in is None  # still readable from the arena's bytes
    e.disk.move(S.RESIDENT)
    e.arena.move(S.FREE)
    assert not e.busy and e.tier == "disk" and e.idle_in == "disk"
