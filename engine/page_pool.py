"""The KV page pool's bookkeeping: which pages are free, and who holds the others.

Pure Python, no torch: the pool tensor itself lives with the model runner; this
class only hands out page indices. A page holds ``page_tokens`` (64) tokens of
keys and values of every full-attention layer.

Invariants (``integrity_check`` verifies every one of them):

    refcount[p] == 0  <=>  p is on the free list (exactly once)
    refcount[p]  > 0  <=>  p is used; refcount[p] == number of registered
                           owners whose ``owned_pages()`` contains p
    len(free) + len(used) == num_pages

Owners are the things that hold pages: live sequences and retained entries.
Each registers itself with ``add_owner`` and lists what it holds through
``owned_pages()``; a page held by nobody registered is a leak, and the check
says so.

Allocation is deterministic: the lowest free ids first, so tests can name the
exact pages a request gets. ``allocate`` never hands out part of a request:
it raises ``PoolExhausted`` and changes nothing.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol

PAGE_TOKENS = 64
"""Tokens per KV page: the unit of sharing, charging and reuse."""


class PoolExhausted(RuntimeError):
    """Not enough free pages for an allocation; nothing was allocated."""


class PoolCorrupted(RuntimeError):
    """The pool's counts disagree with its owners or its free list; the message lists the differences."""


class PageOwner(Protocol):
    """Anything that holds pages: it says which (each page at most once)."""

    def owned_pages(self) -> Sequence[int]: ...


class PagePool:
    """Reference-counted page ids ``0 .. num_pages-1``."""

    def __init__(self, num_pages: int, page_tokens: int = PAGE_TOKENS):
        if type(num_pages) is not int or num_pages < 1:
            raise ValueError(f"num_pages must be a positive integer, got {num_pages!r}")
        if type(page_tokens) is not int or page_tokens < 1:
            raise ValueError(f"page_tokens must be a positive integer, got {page_tokens!r}")
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self._refcount = [0] * num_pages
        self._free = list(range(num_pages))  # a min-heap of free ids
        self._owners: dict[int, PageOwner] = {}  # id(owner) -> owner

    # ----- queries -----------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def owners(self) -> tuple[PageOwner, ...]:
        return tuple(self._owners.values())

    def refcount(self, page: int) -> int:
        self._check_id(page)
        return self._refcount[page]

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens: ceil(num_tokens / page_tokens)."""
        if type(num_tokens) is not int or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
        return -(-num_tokens // self.page_tokens)

    # ----- page lifecycle ------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh pages (refcount 1), lowest ids first; all or nothing."""
        if type(n) is not int or n < 0:
            raise ValueError(f"cannot allocate {n!r} pages")
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} pages, {len(self._free)} of {self.num_pages} free")
        pages = [heapq.heappop(self._free) for _ in range(n)]
        for p in pages:
            self._refcount[p] = 1
        return pages

    def share(self, pages: Iterable[int]) -> None:
        """One more reference to each page (each must be in use); all or nothing."""
        pages = list(pages)
        for p in pages:
            self._check_id(p)
            if self._refcount[p] == 0:
                raise ValueError(f"page {p} is free; only a used page can be shared")
        for p in pages:
            self._refcount[p] += 1

    def free(self, pages: Iterable[int]) -> None:
        """Drop one reference per listed page; a page at zero goes back to the free list.

        A page may be listed several times (one reference each). Checked before
        anything changes: freeing more references than a page has raises.
        """
        pages = list(pages)
        for p in pages:
            self._check_id(p)
        for p, times in Counter(pages).items():
            if times > self._refcount[p]:
                raise ValueError(f"page {p} has {self._refcount[p]} reference(s), cannot drop {times}")
        for p in pages:
            self._refcount[p] -= 1
            if self._refcount[p] == 0:
                heapq.heappush(self._free, p)

    def copy_on_write(self, page: int) -> tuple[int, bool]:
        """Make ``page`` writable by one holder.

        Sole holder (refcount 1): returns ``(page, False)``. Shared: allocates a
        fresh page, drops one reference from the old one, and returns
        ``(new_page, True)``; the caller copies the data and updates its own
        page table. Raises ``PoolExhausted`` (changing nothing) if no page is free.
        """
        self._check_id(page)
        count = self._refcount[page]
        if count == 0:
            raise ValueError(f"page {page} is free; nothing to copy")
        if count == 1:
            return page, False
        (new,) = self.allocate(1)
        self._refcount[page] -= 1
        return new, True

    # ----- owners and integrity -------------------------------------------------

    def add_owner(self, owner: PageOwner) -> None:
        if id(owner) in self._owners:
            raise ValueError(f"{owner!r} is already registered with the pool")
        self._owners[id(owner)] = owner

    def remove_owner(self, owner: PageOwner) -> None:
        if self._owners.pop(id(owner), None) is None:
            raise ValueError(f"{owner!r} is not registered with the pool")

    def integrity_check(self) -> None:
        """Rebuild every refcount from the owners and compare; raise ``PoolCorrupted`` with all differences."""
        problems: list[str] = []
        expected = [0] * self.num_pages
        for owner in self._owners.values():
            held = list(owner.owned_pages())
            for p, times in Counter(held).items():
                if type(p) is not int or not 0 <= p < self.num_pages:
                    problems.append(f"{owner!r} holds page {p!r}, outside 0..{self.num_pages - 1}")
                    continue
                if times > 1:
                    problems.append(f"{owner!r} lists page {p} {times} times")
                expected[p] += times
        for p in range(self.num_pages):
            if expected[p] != self._refcount[p]:
                problems.append(f"page {p}: refcount {self._refcount[p]}, owners hold {expected[p]}")
        free_counts = Counter(self._free)
        problems += [f"free list holds {p!r}, not a page id" for p in free_counts if type(p) is not int
                     or not 0 <= p < self.num_pages]
        problems += [f"page {p} is on the free list {n} times" for p, n in free_counts.items() if n > 1]
        problems += [f"page {p} has a negative refcount" for p in range(self.num_pages) if self._refcount[p] < 0]
        free = set(free_counts)
        used = {p for p in range(self.num_pages) if self._refcount[p] > 0}
        problems += [f"page {p} is both free and used" for p in sorted(free & used)]
        seen = free | used
        problems += [f"page {p} is neither free nor used" for p in range(self.num_pages) if p not in seen]
        if len(self._free) + len(used) != self.num_pages:
            problems.append(f"{len(self._free)} free + {len(used)} used != {self.num_pages} pages")
        if problems:
            shown = "; ".join(problems[:20])
            more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
            raise PoolCorrupted(f"page pool integrity check failed: {shown}{more}")

    def _check_id(self, page: object) -> None:
        if type(page) is not int or not 0 <= page < self.num_pages:
            raise ValueError(f"page id {page!r} is outside 0..{self.num_pages - 1}")
