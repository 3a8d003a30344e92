"""The engine's tierd client: hello once, then demote / restore / lookup / drop, each awaited to completion.

A copy is acknowledged by tierd only once it is complete, and the engine
reuses no page or slot a copy still reads or writes: every call here waits
for its reply (the copies are memory-to-memory; KV-disk writes happen later,
on tierd's own threads). Before a demote or a restore the engine's queued
device work is finished (``sync``, CUDA only), so tierd reads what the
engine wrote and overwrites nothing a kernel still reads. A tierd that is gone or slow is a cache miss, not
an outage: a call that times out marks the client down for ``backoff_s``
and returns a failure, and the engine carries on without the lower tiers.
"""

from __future__ import annotations

import logging
import queue
import time

import zmq

from ignis.shared.tier_layout import BlockDesc, UnitLayout
from ignis.shared.tier_wire import (
    TIER_PROTOCOL_VERSION,
    Bye,
    Demote,
    Demoted,
    Detached,
    Drop,
    Dropped,
    ErrorReply,
    Hello,
    Lookup,
    LookupReply,
    Missing,
    Restore,
    Restored,
    TierRefused,
    Welcome,
)
from ignis.shared.zmq_queues import connect_dealer

log = logging.getLogger("ignis.engine.tiers")

REPLIES = (Welcome, Detached, Demoted, Restored, Missing, Dropped, LookupReply, TierRefused, ErrorReply)


class TierClient:
    def __init__(self, endpoint: str, stamp: str, family: str, block_bytes: int, blocks: list[BlockDesc],
                 unit: UnitLayout, timeout_s: float = 10.0, backoff_s: float = 5.0, sync=None,
                 engine_id: str = "default"):
        self.endpoint = endpoint
        self.engine_id = engine_id
        self.stamp = stamp
        self.family = family
        self.block_bytes = block_bytes
        self.blocks = tuple(blocks)
        self.unit = unit
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.sync = sync  # waits for the engine's queued device work (None on the CPU)
        self._req = 0
        self._down_until = 0.0
        self.welcome: Welcome | None = None
        self.connects = 0  # accepted hellos: after each, tierd holds nothing of ours from before
        self.channel = connect_dealer(zmq.Context.instance(), endpoint, REPLIES, name="tierd").start()

    # ----- plumbing ---------------------------------------------------------------

    def _next(self) -> int:
        self._req += 1
        return self._req

    def _call(self, msg, req: int):
        if time.monotonic() < self._down_until:
            return None
        self.channel.send(msg)
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("tierd did not answer %s in %.1fs: lower tiers off for %.0fs",
                            type(msg).__name__, self.timeout_s, self.backoff_s)
                self._down_until = time.monotonic() + self.backoff_s
                self.welcome = None
                return None
            try:
                reply = self.channel.get(timeout=left).message
            except queue.Empty:
                continue
            if isinstance(reply, ErrorReply):
                log.warning("tierd could not read a message: %s", reply.message)
                return None
            if getattr(reply, "req", None) == req:
                return reply
            # a late answer to a call that timed out earlier: nothing waits for it now

    def connect(self) -> bool:
        """Say hello (again, after tierd restarted): every entry it held for us is gone."""
        req = self._next()
        reply = self._call(Hello(req=req, protocol=TIER_PROTOCOL_VERSION, stamp=self.stamp, family=self.family,
                                 block_bytes=self.block_bytes, blocks=self.blocks, unit=self.unit,
                                 engine_id=self.engine_id), req)
        if isinstance(reply, Welcome):
            self.welcome = reply
            self.connects += 1
            log.info("tierd connected: arena %d bytes (%d locked), KV-disk %d bytes", reply.arena_bytes,
                     reply.locked_bytes, reply.disk_bytes)
            return True
        if isinstance(reply, TierRefused):
            log.error("tierd refused hello: %s", reply.message)
        return False

    @property
    def ready(self) -> bool:
        if self.welcome is None and time.monotonic() >= self._down_until:
            self.connect()
        return self.welcome is not None

    # ----- operations ---------------------------------------------------------------

    def _call_hello_first(self, make):
        """A demote or restore (after ``sync``); if tierd restarted and no longer knows us, say hello
        again and retry once."""
        if self.sync is not None:
            self.sync()
        req = self._next()
        reply = self._call(make(req), req)
        if isinstance(reply, TierRefused) and reply.reason == "not_ready":
            log.warning("tierd does not know this engine (it restarted?): saying hello again")
            self.welcome = None
            if self.connect():
                req = self._next()
                reply = self._call(make(req), req)
        return reply

    def demote(self, key: str, source: list[tuple[str, int]], kind: str, request_class: str,
               last_used: float) -> str | None:
        """Copy an entry down; returns the tier it landed in ("ram"/"disk") or None."""
        if not self.ready:
            return None
        reply = self._call_hello_first(lambda req: Demote(
            req=req, key=key, stamp=self.stamp, source=tuple(source), target="auto", kind=kind,
            request_class=request_class, last_used=last_used))
        if isinstance(reply, Demoted):
            return reply.tier
        if isinstance(reply, TierRefused):
            log.info("tierd refused demote of %s: %s", key, reply.reason)
        return None

    def restore(self, key: str, dest: list[tuple[str, int]]) -> str | None:
        """Copy an entry back into ``dest``; the tier it was read from ("ram"/"disk"), or None on a miss
        (the destination is then unused)."""
        if not self.ready:
            return None
        reply = self._call_hello_first(lambda req: Restore(req=req, key=key, stamp=self.stamp, dest=tuple(dest)))
        if isinstance(reply, Restored):
            return reply.tier
        if isinstance(reply, (Missing, TierRefused)):
            log.info("restore of %s missed: %s", key, getattr(reply, "reason", ""))
        return None

    def lookup(self, keys: list[str]) -> dict[str, str | None] | None:
        """Where tierd holds each key now ("ram", "disk", or None: gone); None when tierd cannot answer.
        tierd moves entries to KV-disk and discards them on its own, so the engine asks before it picks."""
        if not self.ready:
            return None
        req = self._next()
        reply = self._call(Lookup(req=req, stamp=self.stamp, keys=tuple(keys)), req)
        if isinstance(reply, TierRefused) and reply.reason == "not_ready":
            self.welcome = None  # tierd restarted: the next call says hello, which clears what we knew
            return None
        if not isinstance(reply, LookupReply) or tuple(reply.keys) != tuple(keys):
            return None
        return dict(zip(reply.keys, reply.tiers))

    def drop(self, key: str) -> None:
        if self.ready:
            req = self._next()
            self._call(Drop(req=req, key=key), req)

    def bye(self) -> bool:
        """Detach for good before the engine frees its memory: tierd lets its copies in flight finish,
        drops every entry it held for us and unmaps the pool and slots, then answers. False when it
        did not answer (gone, or slow): the caller frees its memory anyway."""
        if self.welcome is None:
            return True  # tierd holds no mapping of ours
        req = self._next()
        reply = self._call(Bye(req=req), req)
        self.welcome = None
        return isinstance(reply, Detached)

    def close(self) -> None:
        self.channel.close()
