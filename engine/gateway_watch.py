"""Orphans: which gateways holding requests here have gone away.

A gateway is gone when

- a send to it failed because its connection is gone (the channel's
  ``unreachable``: a ROUTER with mandatory routing says so at the first
  token sent after a gateway process dies), or
- it heartbeats (its routing id says so, ``shared.zmq_queues.is_heartbeating``:
  a gateway asks for Stats every second) and has been silent for more than
  ``silence_s`` (``--gateway-silence-timeout``): a gateway that hangs, or
  whose host vanished without closing its connection.

A peer that does not heartbeat (a test client, a tool) is judged only by the
first rule. Pure Python: when ``due`` (at most every ``CHECK_EVERY_S``), the
engine loop asks ``gone`` with the peers that hold requests, and aborts theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ignis.shared.zmq_queues import is_heartbeating

CHECK_EVERY_S = 0.05


class GatewayWatch:
    """``channel``: a ROUTER ``Channel`` (its ``last_heard`` and ``unreachable``);
    ``silence_s`` 0: the silence rule is off."""

    def __init__(self, channel, silence_s: float, clock: Callable[[], float] = time.monotonic):
        if silence_s < 0:
            raise ValueError(f"--gateway-silence-timeout must be >= 0, got {silence_s}")
        self.channel = channel
        self.silence_s = silence_s
        self.clock = clock
        self._next_check = 0.0

    def due(self) -> bool:
        """Time for a look (at most every ``CHECK_EVERY_S``): the caller then gathers its peers."""
        now = self.clock()
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_EVERY_S
        return True

    def gone(self, peers: Iterable[bytes]) -> list[tuple[bytes, str]]:
        """The peers among ``peers`` that are gone, each with why (for the log)."""
        now = self.clock()
        out = []
        for peer in set(peers):
            if peer in self.channel.unreachable:
                out.append((peer, "its connection is gone"))
                continue
            if not self.silence_s or not is_heartbeating(peer):
                continue
            silent = now - self.channel.last_heard.get(peer, now)
            if silent > self.silence_s:
                out.append((peer, f"silent for {silent:.1f}s"))
        return out
