"""Handles of exchanges with tierd in flight (``TierOp``), and page holds that outlive a page table.

Pure Python, no torch, no sockets. An exchange has two moments, and a
handle tells each apart::

    posted ──reply / deadline──> done (ok: ``value``; failed: ``reason``)
                                   └──> free: tierd no longer reads or writes the memory the exchange named

For most exchanges both moments are the same. A restore that timed out is
done (the request goes on without it: a miss) but not free: tierd may still
be writing into its pages and slot, so they stay out of use until the late
reply, the next accepted hello, or the client's quarantine ends
(``engine.tiers.client``). Callbacks run on the engine loop, inside
``TierPort.poll`` (or at once, for a port that answers synchronously).

``PageHold`` keeps pages out of the pool while a copy still reads or writes
them, after whoever used them (a retained entry, a live sequence) has let go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ignis.engine.page_pool import PagePool

PENDING, OK, FAILED = "pending", "ok", "failed"


class TierOp:
    """One exchange with tierd. ``value``: the reply's payload (a tier name, a lookup dict) once ok."""

    def __init__(self, what: str):
        self.what = what
        self.state = PENDING
        self.value = None
        self.reason = ""
        self.memory_free = False
        self._on_done: list[Callable[[TierOp], None]] = []
        self._on_free: list[Callable[[TierOp], None]] = []

    def __repr__(self) -> str:
        return f"TierOp({self.what}, {self.state}{', ' + self.reason if self.reason else ''})"

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    @property
    def ok(self) -> bool:
        return self.state == OK

    def when_done(self, fn: Callable[[TierOp], None]) -> None:
        """``fn(op)`` once the outcome is known (now, if it is)."""
        if self.pending:
            self._on_done.append(fn)
        else:
            fn(self)

    def when_free(self, fn: Callable[[TierOp], None]) -> None:
        """``fn(op)`` once tierd no longer touches the memory this exchange named (now, if so)."""
        if self.memory_free:
            fn(self)
        else:
            self._on_free.append(fn)

    def finish(self, value) -> None:
        if self.pending:
            self.state, self.value = OK, value
            self._run(self._on_done)
        self.release()

    def fail(self, reason: str, memory_free: bool = True) -> None:
        if self.pending:
            self.state, self.reason = FAILED, reason
            self._run(self._on_done)
        if memory_free:
            self.release()

    def release(self) -> None:
        """tierd is done with this exchange's memory."""
        if not self.memory_free:
            self.memory_free = True
            self._run(self._on_free)

    def _run(self, callbacks: list) -> None:
        todo = list(callbacks)
        callbacks.clear()
        for fn in todo:
            fn(self)


def settled(what: str, value) -> TierOp:
    """A handle already done: ok with ``value``, or failed when ``value`` is None or False."""
    op = TierOp(what)
    if value is None or value is False:
        op.fail("refused")
    else:
        op.finish(value)
    return op


def as_op(what: str, value) -> TierOp:
    """A port's answer as a handle: asynchronous ports return handles, synchronous ones plain values."""
    return value if isinstance(value, TierOp) else settled(what, value)


class PageHold:
    """One more reference to ``pages`` until ``release``: a registered owner of the pool, so the
    integrity check counts it, and the pages go back to the free list only when every holder let go."""

    def __init__(self, pool: PagePool, pages: Sequence[int], name: str):
        self.pool = pool
        self.name = name
        self._pages = [int(p) for p in pages]
        pool.share(self._pages)
        pool.add_owner(self)
        self._released = False

    def __repr__(self) -> str:
        return f"PageHold({self.name!r}, {len(self._pages)} pages)"

    @property
    def pages(self) -> tuple[int, ...]:
        return tuple(self._pages)

    def owned_pages(self) -> Sequence[int]:
        return self._pages

    def sole(self) -> int:
        """Pages that go back to the free list when this hold is released (no one else holds them)."""
        return sum(1 for p in self._pages if self.pool.refcount(p) == 1)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.pool.free(self._pages)
        self._pages = []
        self.pool.remove_owner(self)
