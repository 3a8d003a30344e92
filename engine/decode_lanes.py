"""Decode lanes: slot indices into the model's live recurrent state, and the requests holding them.

A free lane is taken lowest index first. A running request holds exactly one
lane and one page table (``SequencePages``): taking a lane gives it an empty
table, giving the lane back releases the table's pages. Pure Python, no torch.
"""

from __future__ import annotations

import heapq
from collections.abc import ValuesView

from ignis.engine.page_pool import PagePool
from ignis.engine.request import Request
from ignis.engine.sequence_pages import SequencePages


class DecodeLanes:
    """``count`` lanes over ``pool``; holders are kept in the order they took their lanes."""

    def __init__(self, count: int, pool: PagePool):
        self.pool = pool
        self._free = list(range(count))  # min-heap
        self._held: dict[int, Request] = {}

    def __len__(self) -> int:
        return len(self._held)

    @property
    def any_free(self) -> bool:
        return bool(self._free)

    def holders(self) -> ValuesView[Request]:
        """Running requests, in the order they took their lanes (a live view)."""
        return self._held.values()

    def by_lane(self) -> list[Request]:
        return [self._held[lane] for lane in sorted(self._held)]

    def take(self, req: Request) -> None:
        """Seat ``req`` on the lowest free lane with an empty page table; a lane must be free."""
        req.lane = heapq.heappop(self._free)
        self._held[req.lane] = req
        req.page_table = SequencePages(self.pool, req.req_id)

    def release(self, req: Request) -> None:
        """``req`` gives back its lane and every page its table holds."""
        req.page_table.release()
        req.page_table = None
        del self._held[req.lane]
        heapq.heappush(self._free, req.lane)
        req.lane = None
