"""Mapping exported shm blocks (zero copy) and checking ref lists against them and the unit layout."""

from __future__ import annotations

import importlib.util

import pytest

from ignis.shared.shm_blocks import ShmBlock
from ignis.shared.tier_wire import BlockDesc, UnitLayout
from ignis.tierd.memory_map import EngineMemory, LayoutError


@pytest.fixture
def blocks():
    made = [ShmBlock.create("kv", 4, 8, 64, instance="test"), ShmBlock.create("ssm", 3, 2, 16, instance="test"),
            ShmBlock.create("conv", 3, 2, 8, instance="test"), ShmBlock.create("host_slots", 1, 2, 72, instance="test")]
    yield made
    for b in made:
        b.close()


def test_the_mapping_is_a_view_of_the_engines_memory(blocks):
    mem = EngineMemory(tuple(b.descriptor() for b in blocks), UnitLayout())
    try:
        blocks[0].item(5)[:] = 9
        assert (mem.blocks["kv"].view[:, 5, :] == 9).all()
        mem.blocks["ssm"].view[2, 1, :] = 4
        assert (blocks[1].item(1)[2] == 4).all()
    finally:
        mem.close()


@pytest.mark.parametrize("refs", [
    (("kv", 1), ("kv", 0), ("ssm", 1), ("conv", 1)),
    (("kv", 7),),
    (("ssm", 0), ("conv", 1)),
    (("kv", 2), ("host_slots", 1)),
    (("host_slots", 0),),
])
def test_refs_the_layout_allows(blocks, refs):
    mem = EngineMemory(tuple(b.descriptor() for b in blocks), UnitLayout())
    try:
        got = mem.resolve(refs)
        assert got.shape == tuple(n for n, _ in refs)
        assert got.nbytes == sum(mem.blocks[n].item_total for n, _ in refs)
    finally:
        mem.close()


@pytest.mark.parametrize("refs,match", [
    ((("kv", 8),), "items 0..7"),
    ((("gpu", 0),), "names block 'gpu'"),
    ((("kv", 1), ("kv", 1)), "twice"),
    ((("ssm", 0), ("kv", 1)), "then one item of each"),
    ((("kv", 1), ("ssm", 0)), "then one item of each"),
    ((("ssm", 0), ("conv", 0), ("host_slots", 0)), "then one item of each"),
])
def test_refs_the_layout_refuses(blocks, refs, match):
    mem = EngineMemory(tuple(b.descriptor() for b in blocks), UnitLayout())
    try:
        with pytest.raises(LayoutError, match=match):
            mem.resolve(refs)
    finally:
        mem.close()


def test_missing_or_short_shared_memory_is_a_layout_error(blocks):
    gone = BlockDesc("kv", "shm", "ignis-test-nothing-here", 1, 1, 64, 64)
    with pytest.raises(LayoutError, match="no shared memory named"):
        EngineMemory((gone,), UnitLayout(pages="kv", lane=(), image=None))
    d = blocks[0].descriptor()
    big = BlockDesc("kv", "shm", d.handle, d.runs, d.items + 1, d.item_bytes, (d.items + 1) * d.item_bytes)
    with pytest.raises(LayoutError, match="the descriptor needs"):
        EngineMemory((big,), UnitLayout(pages="kv", lane=(), image=None))


def test_lane_blocks_must_agree_on_the_lane_count(blocks):
    conv = ShmBlock.create("conv", 3, 3, 8, instance="test")
    try:
        descs = (blocks[0].descriptor(), blocks[1].descriptor(), conv.descriptor())
        with pytest.raises(LayoutError, match="same number of items"):
            EngineMemory(descs, UnitLayout(image=None))
    finally:
        conv.close()


def test_cuda_ipc_without_cupy_is_a_clear_layout_error():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed here")
    desc = BlockDesc("kv", "cuda_ipc", "ab" * 64, 1, 1, 64, 64)
    with pytest.raises(LayoutError, match="needs cupy"):
        EngineMemory((desc,), UnitLayout(pages="kv", lane=(), image=None))
