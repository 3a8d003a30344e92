"""Cache resets a gateway asks for (``FlushCache``): done between rounds, once nothing stands in their way.

A reset drops every retained entry in every tier and what the engine learned
of recent prompts (``Scheduler.flush_retained``), so the next request meets
the engine as a fresh one would: what vLLM's ``/reset_prefix_cache`` and
SGLang's ``/flush_cache`` give benchmarks and operators. It is done only on an
engine that holds no request, as theirs are (vLLM's reset fails while blocks
are in use, SGLang's flush while requests run or wait):

- a request in flight, in the scheduler or waiting before it (for a model
  load or its grammar's compile), refuses the reset at once, saying how many;
- copies to or from tierd still in flight are waited out, a round at a time,
  for at most ``WAIT_S``;
- an engine with no model loaded holds nothing: the reset is done at once.

Each reset is answered ``CacheFlushed`` to the gateway that asked, logged and
counted (``ignis:reuse_flushes_total``); the engine's Stats snapshot is taken
again before the answer goes, so a Stats asked after it shows the reset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ignis.shared.wire import CacheFlushed, FlushCache

log = logging.getLogger("ignis.engine")

WAIT_S = 10.0
"""How long a reset waits for copies to or from tierd to land (a disk write lasts well under this)."""


class CacheFlushes:
    def __init__(self, send: Callable[[object, bytes], None], clock: Callable[[], float] = time.monotonic,
                 refresh: Callable[[], None] = lambda: None):
        self._send = send
        self._refresh = refresh  # the engine's Stats snapshot taken again: a Stats after the answer sees the reset
        self._clock = clock
        self._pending: list[tuple[bytes, FlushCache, float]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def ask(self, peer: bytes, msg: FlushCache) -> None:
        self._pending.append((peer, msg, self._clock() + WAIT_S))

    def service(self, scheduler, waiting_outside: int) -> None:
        """Between rounds: answer every reset that can be answered now. ``scheduler``: the loaded model's
        (None: no model loaded); ``waiting_outside``: requests waiting before the scheduler."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for peer, msg, deadline in pending:
            if scheduler is None:
                if waiting_outside:
                    self._refuse(peer, msg, requests_in_flight(waiting_outside))
                else:
                    self._send(CacheFlushed(msg.id, True, 0), peer)
                continue
            blocker = scheduler.flush_blocker()
            if blocker is None and waiting_outside:
                blocker = requests_in_flight(waiting_outside), False
            if blocker is None:
                try:
                    dropped, told = scheduler.flush_retained()
                except Exception as exc:  # a reset that fails must not take the loop down
                    log.exception("prefix cache reset failed")
                    self._refuse(peer, msg, f"the reset failed: {exc}")
                    continue
                self._refresh()
                if told:
                    log.info("prefix cache reset: %d retained entries dropped in every tier", dropped)
                else:
                    log.warning("prefix cache reset: %d retained entries dropped; tierd is unreachable, and "
                                "begins empty when it is found again", dropped)
                self._send(CacheFlushed(msg.id, True, dropped), peer)
            elif blocker[1] and self._clock() < deadline:
                self._pending.append((peer, msg, deadline))  # copies land within rounds: ask again next turn
            else:
                self._refuse(peer, msg, blocker[0] if not blocker[1] else f"{blocker[0]} for {WAIT_S:g} s")

    def _refuse(self, peer: bytes, msg: FlushCache, why: str) -> None:
        log.info("prefix cache reset refused: %s", why)
        self._send(CacheFlushed(msg.id, False, message=why), peer)


def requests_in_flight(n: int) -> str:
    """Why a reset waits or is refused: "N requests are in flight"."""
    return f"{n} request is in flight" if n == 1 else f"{n} requests are in flight"
