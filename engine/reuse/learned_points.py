"""Learned capture points: a bounded, token-only index of recently served prompts.

The template's marks and the part mark predict where prompts repeat; this
index sees where they actually did. It keeps, per recent prompt, the chain
hashes of its full pages (``engine.reuse.hashing``) and the capture points
its request planned; no KV, no state. When a new prompt shares whole pages
with an earlier one, and the last capture point either request plans inside
that shared prefix is at least a page short of its end, the new request's
own prefill captures at the page where the two diverge (its *learned
point*), so the next prompt that repeats the prefix resumes there.

    owner : page hash h_k -> id of the newest record holding it
    records (oldest first): id -> (h_1 .. h_K, capture points)

Invariants:

- Bounded: at most ``max_prompts`` records and ``max_pages`` hashes in all;
  recording a prompt evicts the oldest records until both hold (at the
  defaults, 256 and 65,536, about 100 bytes a page: under 7 MB).
- Eviction is oldest first, so a hash still owned by the record being
  evicted is held by no newer record and leaves the index with it.
- Prefix-closed: if h_k is in the index, so is h_{k-1} (the newest record
  holding h_k holds h_{k-1}, and nothing newer is evicted before it), so the
  deepest shared page is found by bisection.
- A hash collision can only plan a useless capture: every resume is still
  verified token by token by the store.

Pure Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ignis.engine.reuse.hashing import page_chain


@dataclass(frozen=True)
class Observation:
    """What the index said of a new prompt, before recording it."""

    shared_tokens: int  # whole pages (in tokens) it shares with the most similar earlier prompt
    earlier_cuts: tuple[int, ...]  # that prompt's capture points
    learned_at: int | None  # where this request should capture (None: its own points suffice)


@dataclass(frozen=True)
class _Record:
    hashes: tuple[bytes, ...]  # h_1 .. h_K (h_0, the seed, is implied)
    cuts: tuple[int, ...]


class LearnedPoints:
    def __init__(self, page_tokens: int, max_prompts: int = 256, max_pages: int = 1 << 16):
        if page_tokens < 1 or max_prompts < 1 or max_pages < 1:
            raise ValueError("page_tokens, max_prompts and max_pages must be >= 1")
        self.page_tokens = page_tokens
        self.max_prompts = max_prompts
        self.max_pages = max_pages
        self._records: OrderedDict[int, _Record] = OrderedDict()
        self._owner: dict[bytes, int] = {}
        self._pages = 0
        self._next_id = 0
        self.learned = 0  # learned points planned

    def __len__(self) -> int:
        return len(self._records)

    @property
    def num_pages(self) -> int:
        return self._pages

    def shared(self, hashes: Sequence[bytes]) -> tuple[int, tuple[int, ...]]:
        """Deepest k such that h_k (``hashes[k]``, ``hashes[0]`` the seed) is indexed, and the
        capture points of the newest prompt that holds it (k = 0: nothing shared, no points)."""
        lo, hi = 0, len(hashes) - 1  # invariant: hashes[lo] is shared (k = 0 trivially)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid] in self._owner:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, ()
        return lo, self._records[self._owner[hashes[lo]]].cuts

    def observe(self, tokens: Sequence[int], cuts: Sequence[int],
                place: Callable[[int], int] | None = None) -> Observation:
        """Look ``tokens`` up, plan its learned point, and record it with its capture points.
        ``place`` moves a point where a capture can be (before an image it falls inside; 0: none),
        so the index records the point the request will plan."""
        pt = self.page_tokens
        hashes = page_chain(tokens, pt)
        k, earlier = self.shared(hashes)
        shared = k * pt
        best = max((c for c in (*cuts, *earlier) if c <= shared), default=0)
        learned = shared if shared - best >= pt and shared < len(tokens) else None
        if learned is not None and place is not None:
            learned = place(learned) or None
        if learned is not None:
            self.learned += 1
        self._record(hashes, tuple(sorted({*cuts, *(() if learned is None else (learned,))})))
        return Observation(shared, earlier, learned)

    def _record(self, hashes: list[bytes], cuts: tuple[int, ...]) -> None:
        own = tuple(hashes[1:1 + self.max_pages])
        rid = self._next_id
        self._next_id += 1
        self._records[rid] = _Record(own, cuts)
        self._pages += len(own)
        for h in own:
            self._owner[h] = rid
        while len(self._records) > self.max_prompts or self._pages > self.max_pages:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        rid, rec = self._records.popitem(last=False)
        self._pages -= len(rec.hashes)
        for h in rec.hashes:
            if self._owner.get(h) == rid:
                del self._owner[h]

    def clear(self) -> None:
        self._records.clear()
        self._owner.clear()
        self._pages = 0

    def check(self) -> None:
        """Integrity: rebuild the owner map and the page count from the records and compare."""
        owner: dict[bytes, int] = {}
        pages = 0
        for rid, rec in self._records.items():
            pages += len(rec.hashes)
            for h in rec.hashes:
                owner[h] = rid
        if owner != self._owner or pages != self._pages:
            raise AssertionError("learned-points index is inconsistent with its records")
        if len(self._records) > self.max_prompts or self._pages > self.max_pages:
            raise AssertionError("learned-points index is over its bounds")
