"""Grammars compiled off the engine loop, and the requests that wait for them.

A grammar's first compile can take seconds: the first grammar an engine meets
builds the library's view of the vocabulary (about 2 s at Qwen's 248K ids),
and a grammar of tens of thousands of alternatives compiles for as long. On
the loop that would stall every lane's round; here it runs on one worker
thread while the loop goes on. The request waits in ``waiting`` (it holds no
lane and no page) until its compile ends; then intake takes it again
(``Intake.compiled``) and finds the grammar cached, or refuses it with the
library's complaint. Requests naming the same text share one compile, and a
compiled template is cached in the grammar lanes it was made for even when
every request that waited for it has gone (aborted, its gateway gone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ignis.engine.grammar_cache import GrammarCache, GrammarError
from ignis.engine.grammar_lanes import GrammarLanes
from ignis.shared.wire import Generate


@dataclass
class Compile:
    """One grammar text being compiled for one model's grammar lanes, and the requests it holds."""

    lanes: GrammarLanes
    text: str
    future: Future
    messages: list[Generate] = field(default_factory=list)


@dataclass
class Compiled:
    """A compile that ended: its requests still waiting, in arrival order; ``error`` None when the
    template is now cached in its lanes."""

    requests: list[tuple[bytes, Generate]]
    error: GrammarError | None
    seconds: float


def _compile(cache: GrammarCache, text: str) -> tuple[object, float]:
    """On the worker: the template or the ``GrammarError`` (never raises), and the seconds it took."""
    t0 = time.perf_counter()
    try:
        result = cache.compile(text)
    except GrammarError as e:
        result = e
    except Exception as e:  # the library failed unexpectedly: that request is refused, serving goes on
        result = GrammarError(f"the grammar library failed: {type(e).__name__}: {e}")
    return result, time.perf_counter() - t0


class GrammarCompiles:
    """Compiles on one worker thread; ``notify()`` is called (on the worker) as each ends, to wake the loop."""

    def __init__(self, notify: Callable[[], None]):
        self._notify = notify
        self._worker: ThreadPoolExecutor | None = None  # made by the first compile
        self.waiting: dict[str, tuple[bytes, Generate]] = {}
        self._compiles: dict[tuple[int, str], Compile] = {}

    def __len__(self) -> int:
        return len(self.waiting)

    def __contains__(self, rid: str) -> bool:
        return rid in self.waiting

    @property
    def in_flight(self) -> int:
        return len(self._compiles)

    def start(self, peer: bytes, msg: Generate, lanes: GrammarLanes) -> None:
        """``msg`` waits for its grammar (``msg.grammar``) to compile for ``lanes``."""
        key = (id(lanes), msg.grammar)
        job = self._compiles.get(key)
        if job is None:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
            future = self._worker.submit(_compile, lanes.cache, msg.grammar)
            job = self._compiles[key] = Compile(lanes, msg.grammar, future)
            future.add_done_callback(lambda _f: self._notify())
        job.messages.append(msg)
        self.waiting[msg.id] = (peer, msg)

    def finished(self) -> Iterator[Compiled]:
        """The compiles that have ended, one at a time; each successful template is cached just before
        its ``Compiled`` is given, so its requests find it however many others end with it."""
        for key, job in list(self._compiles.items()):
            if not job.future.done():
                continue
            del self._compiles[key]
            result, seconds = job.future.result()
            error = result if isinstance(result, GrammarError) else None
            if error is None:
                job.lanes.cache.keep(job.text, result)
            requests = [self.waiting.pop(msg.id) for msg in job.messages  # not one withdrawn (its id may be reused)
                        if msg.id in self.waiting and self.waiting[msg.id][1] is msg]
            yield Compiled(requests, error, seconds)

    def withdraw(self, rid: str) -> tuple[bytes, Generate] | None:
        """Take ``rid`` out of the wait (aborted); its compile goes on and is cached."""
        return self.waiting.pop(rid, None)

    def withdraw_all(self) -> list[tuple[bytes, Generate]]:
        waiting, self.waiting = list(self.waiting.values()), {}
        return waiting

    def close(self) -> None:
        """Stop the worker: a compile in progress is left to end on its own, none queued starts."""
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
