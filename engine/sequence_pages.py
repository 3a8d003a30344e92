"""One sequence's page table: the pages that hold its KV, grown as tokens arrive.

Token position t lives in page ``pages[t // page_tokens]`` at row
``t % page_tokens``:

    positions   0 ........ 63 | 64 ....... 127 | 128 .. 150
    pages       [   p0        |      p1        |  p2 (partial, written) ]

Only whole pages are charged, and only those needed so far: ``ensure_capacity(n)``
makes the table exactly ``ceil(n / page_tokens)`` pages long (it never shrinks).
Full pages may be shared with other holders (prefix reuse); the partial last
page is written, so it is never shared: ``fork_from`` copy-on-writes it.

A ``SequencePages`` registers itself with the pool as a page owner while it
holds pages; ``release`` returns everything and unregisters it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ignis.engine.page_pool import PagePool, PoolExhausted


class SequencePages:
    """Page table of one sequence in ``pool``."""

    def __init__(self, pool: PagePool, name: str = "sequence"):
        self.pool = pool
        self.name = name
        self._pages: list[int] = []
        self._num_tokens = 0
        self._released = False
        pool.add_owner(self)

    def __repr__(self) -> str:
        return f"SequencePages({self.name!r}, {len(self._pages)} pages, {self._num_tokens} tokens)"

    @property
    def pages(self) -> tuple[int, ...]:
        return tuple(self._pages)

    @property
    def num_tokens(self) -> int:
        """Token positions the table covers (the largest capacity asked for)."""
        return self._num_tokens

    def owned_pages(self) -> Sequence[int]:
        return self._pages

    def sole(self) -> int:
        """Pages that go back to the free list when this table is released (no one else holds them)."""
        return sum(1 for p in self._pages if self.pool.refcount(p) == 1)

    def pages_needed(self, num_tokens: int) -> int:
        """New pages ``ensure_capacity(num_tokens)`` would allocate (0 if it already fits)."""
        return max(0, self.pool.pages_for(num_tokens) - len(self._pages))

    def ensure_capacity(self, num_tokens: int) -> list[int]:
        """Cover positions ``0 .. num_tokens-1``; returns the newly allocated pages.

        Raises ``PoolExhausted`` (and allocates nothing) if the pool is short.
        """
        self._check_live()
        new = self.pool.allocate(self.pages_needed(num_tokens))
        self._pages.extend(new)
        self._num_tokens = max(self._num_tokens, num_tokens)
        return new

    def shrink_to(self, num_tokens: int) -> list[int]:
        """Give back the pages past those covering positions ``0 .. num_tokens-1`` (the KV of rejected
        draft tokens); returns them. The table covers ``num_tokens`` positions after."""
        self._check_live()
        keep = self.pool.pages_for(num_tokens)
        dropped = self._pages[keep:]
        if dropped:
            del self._pages[keep:]
            self.pool.free(dropped)
        self._num_tokens = min(self._num_tokens, num_tokens)
        return dropped

    def fork_from(self, shared_pages: Sequence[int], num_tokens: int) -> list[tuple[int, int]]:
        """Start this (empty) table as a copy of another holder's first ``num_tokens`` tokens.

        Full pages are shared in place. A partial last page gets a fresh copy
        (copy-on-write); the returned ``(src_page, dst_page)`` pairs are the
        copies the caller must make before writing. All or nothing: raises
        ``PoolExhausted`` with no change if the copy's page is not free.
        """
        self._check_live()
        if self._pages:
            raise ValueError(f"{self.name}: fork_from needs an empty page table, it holds {len(self._pages)} pages")
        needed = self.pool.pages_for(num_tokens)
        if len(shared_pages) < needed:
            raise ValueError(f"{len(shared_pages)} pages cannot hold {num_tokens} tokens")
        full, partial = divmod(num_tokens, self.pool.page_tokens)
        if partial and self.pool.num_free < 1:
            raise PoolExhausted(f"{self.name}: no free page to copy the partial last page into")
        pages = list(shared_pages[:needed])
        self.pool.share(pages)
        copies = []
        if partial:
            new, needs_copy = self.pool.copy_on_write(pages[-1])
            if needs_copy:
                copies.append((pages[-1], new))
            pages[-1] = new
        self._pages = pages
        self._num_tokens = num_tokens
        return copies

    def adopt(self, other: SequencePages) -> None:
        """Start this (empty) table with every page ``other`` holds, in order; ``other`` is released
        holding nothing (no reference count changes hands twice)."""
        self._check_live()
        other._check_live()
        if self._pages:
            raise ValueError(f"{self.name}: adopt needs an empty page table, it holds {len(self._pages)} pages")
        if other.pool is not self.pool:
            raise ValueError("adopt across pools")
        self._pages, other._pages = other._pages, []
        self._num_tokens, other._num_tokens = other._num_tokens, 0
        other.release()

    def release(self) -> None:
        """Return every page to the pool and unregister; the table cannot be used after."""
        if self._released:
            return
        self.pool.free(self._pages)
        self._pages = []
        self._num_tokens = 0
        self._released = True
        self.pool.remove_owner(self)

    def _check_live(self) -> None:
        if self._released:
            raise RuntimeError(f"{self.name}: page table used after release")
