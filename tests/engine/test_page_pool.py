"""PagePool: exact page ids and refcounts, all-or-nothing allocation, copy-on-write, a real integrity check."""

from __future__ import annotations

import random

import pytest

from ignis.engine.page_pool import PagePool, PoolCorrupted, PoolExhausted


class Holder:
    """A test page owner: a named list of page ids, registered with the pool."""

    def __init__(self, pool: PagePool, name: str, pages=()):
        self.name, self.pages = name, list(pages)
        pool.add_owner(self)

    def owned_pages(self):
        return self.pages

    def __repr__(self):
        return f"Holder({self.name})"


def test_allocate_lowest_ids_first_and_free_returns_them():
    pool = PagePool(8)
    a = Holder(pool, "a", pool.allocate(3))
    b = Holder(pool, "b", pool.allocate(2))
    assert a.pages == [0, 1, 2] and b.pages == [3, 4]
    assert pool.num_free == 3 and pool.num_used == 5
    pool.free(a.pages[1:2])
    a.pages = [0, 2]
    assert pool.refcount(1) == 0 and pool.num_free == 4
    c = Holder(pool, "c", pool.allocate(2))
    assert c.pages == [1, 5]  # the freed id comes back first
    pool.integrity_check()
    for h in (a, b, c):
        pool.free(h.pages)
        pool.remove_owner(h)
    assert pool.num_free == 8
    pool.integrity_check()


def test_allocate_is_all_or_nothing():
    pool = PagePool(4)
    h = Holder(pool, "h", pool.allocate(3))
    with pytest.raises(PoolExhausted, match="asked for 2 pages, 1 of 4 free"):
        pool.allocate(2)
    assert pool.num_free == 1 and pool.allocate(0) == []
    h.pages += pool.allocate(1)
    assert h.pages == [0, 1, 2, 3]
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    pool.integrity_check()


def test_share_and_free_count_references():
    pool = PagePool(4)
    a = Holder(pool, "a", pool.allocate(2))
    pool.share(a.pages)
    b = Holder(pool, "b", list(a.pages))
    assert [pool.refcount(p) for p in range(4)] == [2, 2, 0, 0]
    pool.free(a.pages)
    a.pages = []
    assert [pool.refcount(p) for p in range(4)] == [1, 1, 0, 0] and pool.num_free == 2
    pool.integrity_check()
    pool.free(b.pages)
    b.pages = []
    assert pool.num_free == 4
    pool.integrity_check()


def test_free_checks_before_changing_anything():
    pool = PagePool(4)
    h = Holder(pool, "h", pool.allocate(2))
    with pytest.raises(ValueError, match="page 1 has 1 reference"):
        pool.free([0, 1, 1])
    assert [pool.refcount(p) for p in range(4)] == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        pool.free([0, 9])
    with pytest.raises(ValueError, match="is free"):
        pool.share([0, 3])
    assert pool.refcount(0) == 1
    pool.integrity_check()
    pool.free(h.pages)
    h.pages = []
    pool.integrity_check()


def test_copy_on_write():
    pool = PagePool(4)
    a = Holder(pool, "a", pool.allocate(2))
    assert pool.copy_on_write(1) == (1, False)  # sole holder writes in place
    pool.share([1])
    b = Holder(pool, "b", [1])
    new, needs_copy = pool.copy_on_write(1)
    assert (new, needs_copy) == (2, True)
    b.pages = [new]
    assert [pool.refcount(p) for p in range(4)] == [1, 1, 1, 0]
    pool.integrity_check()
    pool.share([0])
    b.pages.append(0)
    pool.allocate(1)  # page 3, held by nobody: fill the pool
    with pytest.raises(PoolExhausted):
        pool.copy_on_write(0)
    assert pool.refcount(0) == 2  # unchanged
    with pytest.raises(PoolCorrupted, match="page 3: refcount 1, owners hold 0"):
        pool.integrity_check()
    pool.free([3])
    with pytest.raises(ValueError, match="is free"):
        pool.copy_on_write(3)
    pool.integrity_check()
    for h in (a, b):
        pool.free(h.pages)
        h.pages = []
    assert pool.num_free == 4
    pool.integrity_check()


def test_integrity_check_catches_each_kind_of_damage():
    pool = PagePool(6)
    a = Holder(pool, "a", pool.allocate(2))
    pool.integrity_check()
    a.pages.append(5)  # claims a free page
    with pytest.raises(PoolCorrupted, match="page 5: refcount 0, owners hold 1"):
        pool.integrity_check()
    a.pages = [0, 0, 1]
    with pytest.raises(PoolCorrupted, match="lists page 0 2 times"):
        pool.integrity_check()
    a.pages = [0, 1]
    pool._free.append(2)  # a duplicate free id
    with pytest.raises(PoolCorrupted, match="free list 2 times"):
        pool.integrity_check()
    pool._free.remove(2)
    pool._free.append(0)  # a used page on the free list
    with pytest.raises(PoolCorrupted, match="page 0 is both free and used"):
        pool.integrity_check()
    pool._free.remove(0)
    pool._free.remove(4)  # a page lost from both
    with pytest.raises(PoolCorrupted, match="page 4 is neither free nor used"):
        pool.integrity_check()
    pool._free.append(4)
    pool.integrity_check()


def test_owner_registration():
    pool = PagePool(2)
    h = Holder(pool, "h")
    assert pool.owners == (h,)
    with pytest.raises(ValueError, match="already registered"):
        pool.add_owner(h)
    pool.remove_owner(h)
    with pytest.raises(ValueError, match="not registered"):
        pool.remove_owner(h)
    pool.integrity_check()


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        PagePool(bad)
    pool = PagePool(2)
    with pytest.raises(ValueError):
        pool.allocate(-1)
    with pytest.raises(ValueError):
        pool.refcount(2)


def test_pages_for():
    pool = PagePool(2)
    assert [pool.pages_for(n) for n in (0, 1, 63, 64, 65, 128, 129)] == [0, 1, 1, 1, 2, 2, 3]


def test_random_operations_keep_invariants():
    rng = random.Random(7)
    pool = PagePool(32)
    holders = [Holder(pool, f"h{i}") for i in range(6)]
    for _ in range(2000):
        h = rng.choice(holders)
        op = rng.random()
        if op < 0.4:
            n = rng.randint(0, 4)
            try:
                h.pages += pool.allocate(n)
            except PoolExhausted:
                assert pool.num_free < n
        elif op < 0.6 and h.pages:
            other = rng.choice([o for o in holders if o is not h])
            extra = [p for p in h.pages if p not in other.pages]
            pool.share(extra)
            other.pages += extra
        elif op < 0.75 and h.pages:
            p = rng.choice(h.pages)
            try:
                new, copied = pool.copy_on_write(p)
            except PoolExhausted:
                continue
            if copied:
                h.pages[h.pages.index(p)] = new
        elif h.pages:
            drop = rng.sample(h.pages, rng.randint(1, len(h.pages)))
            pool.free(drop)
            h.pages = [p for p in h.pages if p not in drop]
        pool.integrity_check()
    for h in holders:
        pool.free(h.pages)
        h.pages = []
    assert pool.num_free == 32
    pool.integrity_check()
