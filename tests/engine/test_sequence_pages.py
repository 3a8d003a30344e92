"""SequencePages: page-by-page growth, forks that share full pages and copy the partial one, release."""

from __future__ import annotations

import pytest

from ignis.engine.page_pool import PagePool, PoolExhausted
from ignis.engine.sequence_pages import SequencePages


def test_grows_one_page_per_64_tokens():
    pool = PagePool(8)
    seq = SequencePages(pool, "s")
    assert seq.ensure_capacity(1) == [0]
    assert seq.ensure_capacity(64) == []
    assert seq.ensure_capacity(65) == [1]
    assert seq.ensure_capacity(10) == []  # never shrinks
    assert seq.pages == (0, 1) and seq.num_tokens == 65
    assert seq.pages_needed(200) == 2
    assert seq.ensure_capacity(192) == [2]
    pool.integrity_check()
    seq.release()
    assert pool.num_free == 8 and pool.owners == ()
    pool.integrity_check()


def test_ensure_capacity_is_all_or_nothing():
    pool = PagePool(3)
    seq = SequencePages(pool, "s")
    seq.ensure_capacity(64)
    with pytest.raises(PoolExhausted):
        seq.ensure_capacity(64 * 4)
    assert seq.pages == (0,) and seq.num_tokens == 64 and pool.num_free == 2
    pool.integrity_check()
    seq.release()
    pool.integrity_check()


def test_fork_shares_full_pages_and_copies_the_partial_one():
    pool = PagePool(8)
    src = SequencePages(pool, "src")
    src.ensure_capacity(150)  # pages 0, 1 full; 2 partial (22 tokens)
    dst = SequencePages(pool, "dst")
    copies = dst.fork_from(src.pages, 150)
    assert copies == [(2, 3)]
    assert dst.pages == (0, 1, 3) and dst.num_tokens == 150
    assert [pool.refcount(p) for p in range(4)] == [2, 2, 1, 1]
    pool.integrity_check()
    # An exact page boundary needs no copy.
    whole = SequencePages(pool, "whole")
    assert whole.fork_from(src.pages, 128) == []
    assert whole.pages == (0, 1) and [pool.refcount(p) for p in range(4)] == [3, 3, 1, 1]
    pool.integrity_check()
    src.release()
    assert [pool.refcount(p) for p in range(4)] == [2, 2, 0, 1]
    dst.release()
    whole.release()
    assert pool.num_free == 8
    pool.integrity_check()


def test_fork_is_all_or_nothing():
    pool = PagePool(3)
    src = SequencePages(pool, "src")
    src.ensure_capacity(130)  # all three pages
    dst = SequencePages(pool, "dst")
    with pytest.raises(PoolExhausted, match="partial last page"):
        dst.fork_from(src.pages, 100)
    assert dst.pages == () and [pool.refcount(p) for p in range(3)] == [1, 1, 1]
    with pytest.raises(ValueError, match="cannot hold"):
        dst.fork_from(src.pages[:1], 100)
    pool.integrity_check()
    dst.fork_from(src.pages, 128)
    with pytest.raises(ValueError, match="empty page table"):
        dst.fork_from(src.pages, 64)
    pool.integrity_check()
    src.release()
    dst.release()
    assert pool.num_free == 3
    pool.integrity_check()


def test_use_after_release_raises():
    pool = PagePool(2)
    seq = SequencePages(pool, "s")
    seq.ensure_capacity(3)
    seq.release()
    seq.release()  # idempotent
    with pytest.raises(RuntimeError, match="after release"):
        seq.ensure_capacity(1)
    pool.integrity_check()


def test_shrink_to_gives_back_the_pages_past_a_length():
    pool = PagePool(8)
    seq = SequencePages(pool, "s")
    seq.ensure_capacity(130)  # three pages: rejected draft positions reached into the third
    assert seq.shrink_to(129) == []  # position 128 still needs the third page
    assert seq.shrink_to(100) == [2]
    assert seq.pages == (0, 1) and seq.num_tokens == 100 and pool.num_free == 6
    pool.integrity_check()
    seq.release()
    assert pool.num_free == 8
