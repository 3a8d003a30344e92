"""The arena mapping and its block allocator: exact block ids, refusals, and the integrity check."""

from __future__ import annotations

import pytest

from ignis.tierd.arena import PAGE, Arena, BlockAllocator, lock_fix_message


def test_allocator_hands_out_lowest_free_blocks_first():
    a = BlockAllocator(8)
    assert a.allocate(3) == [0, 1, 2]
    assert a.allocate(2) == [3, 4]
    a.free([1, 3])
    assert a.allocate(1) == [1]
    assert a.allocate(3) == [3, 5, 6]
    assert (a.free_count, a.used_count) == (1, 7)
    a.check()


def test_allocator_refuses_without_partial_effects():
    a = BlockAllocator(4)
    blocks = a.allocate(3)
    with pytest.raises(MemoryError, match="2 arena blocks asked for, 1 free"):
        a.allocate(2)
    assert a.free_count == 1
    with pytest.raises(ValueError, match="not allocated"):
        a.free([0, 3])
    with pytest.raises(ValueError, match="repeats"):
        a.free([0, 0])
    assert a.used_count == 3  # nothing was freed by the refused calls
    a.free(blocks)
    assert a.free_count == 4 and a.allocate(0) == []
    a.check()
    with pytest.raises(ValueError):
        BlockAllocator(-1)
    with pytest.raises(ValueError):
        a.allocate(-1)


def test_allocator_check_finds_a_broken_free_list():
    a = BlockAllocator(3)
    a.allocate(1)
    a._free.append(0)  # corrupt it on purpose: block 0 is both free and allocated
    with pytest.raises(RuntimeError, match="both free and allocated"):
        a.check()


def test_arena_is_mapped_touched_and_locked():
    arena = Arena(16 * PAGE, lock="require")  # well under any default RLIMIT_MEMLOCK
    try:
        assert arena.view.nbytes == 16 * PAGE and arena.locked_bytes == 16 * PAGE and arena.unlocked_bytes == 0
        arena.view[:] = 7
        assert int(arena.view.sum()) == 7 * 16 * PAGE
    finally:
        arena.close()


def test_zero_arena_is_kv_ram_off_and_bad_sizes_raise():
    arena = Arena(0)
    assert arena.view.nbytes == 0 and arena.unlocked_bytes == 0
    arena.close()
    with pytest.raises(ValueError, match="reuse-kv-host-pool-bytes"):
        Arena(-1)
    with pytest.raises(ValueError, match="lock"):
        Arena(PAGE, lock="maybe")


def test_the_lock_message_names_the_fixes():
    text = lock_fix_message(1 << 30, "Cannot allocate memory")
    assert "LimitMEMLOCK=infinity" in text and "ulimit -l" in text and "--require-mlock off" in text


def test_release_gives_the_memory_back_and_acquire_takes_it_again():
    a = Arena(4 * PAGE, lock="try")
    a.view[:] = 7
    a.release()
    assert (a.mapped, a.mapped_bytes, a.locked_bytes, a.unlocked_bytes, a.nbytes) == (False, 0, 0, 0, 4 * PAGE)
    a.release()  # twice is fine
    a.acquire()
    assert a.mapped and a.mapped_bytes == 4 * PAGE and len(a.view) == 4 * PAGE
    assert int(a.view.max()) == 0  # fresh memory, nothing of the last session
    a.close()


def test_a_required_lock_that_fails_on_acquire_leaves_the_arena_released(monkeypatch):
    import ignis.tierd.arena as arena_mod

    a = Arena(4 * PAGE, lock="require")
    a.release()

    class NoLock:
        def __init__(self, real):
            self._real = real
            self.mlock = lambda *_: -1

        def __getattr__(self, name):
            return getattr(self._real, name)

    real = arena_mod._libc()
    monkeypatch.setattr(arena_mod, "_libc", lambda: NoLock(real))
    with pytest.raises(arena_mod.MlockError, match="LimitMEMLOCK"):
        a.acquire()
    assert not a.mapped and a.locked_bytes == 0
    monkeypatch.undo()
    a.acquire()
    assert a.mapped and a.locked_bytes == 4 * PAGE
    a.close()
