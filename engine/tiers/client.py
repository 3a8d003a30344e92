"""The engine's tierd client: every exchange is posted and its reply polled, never awaited in a round.

Two phases (``engine.tier_ops.TierOp``)::

    demote / restore / lookup / drop / hello:  post(msg) -> handle   (returns at once)
    poll(wait_s=0)   drains the replies that arrived (the channel's inbox, no blocking),
                     completes their handles, expires those past their deadline

The scheduler polls once at the start of every round (``TierPort.poll``),
and only an idle round waits (briefly) for a reply. The socket lives on the
channel's I/O thread; this class touches only its queues.

Rules the engine's memory depends on:

- Device work is finished before tierd reads or writes engine memory: the
  first demote or restore posted in a round syncs (``sync``, CUDA only), the
  rest of that round's batch shares it. ``device_dirty`` (the image staged for
  a live demote) asks for another sync before the next post.
- A handle past ``timeout_s`` fails, tierd is marked down for ``backoff_s``
  (``welcome`` cleared; every other handle in flight fails with it) and the
  lower tiers are off meanwhile: a cache miss, never an outage. Late replies
  are ignored.
- What a failed handle's memory may do: a demote's pages and slot are free at
  once (tierd only reads them, and whatever it stored is dropped by our next
  hello, which comes before any other exchange). A restore's destination is
  not: tierd may still be writing it. It stays quarantined until the late
  reply to that restore, the next accepted hello (tierd finishes or abandons
  its copies before it answers one: ``tierd.server._end_session``), or
  ``quarantine_s`` after the deadline, the bound past which no copy of tierd
  is assumed alive (tierd abandons a session's copies after 30 s).
- A ``not_ready`` refusal (tierd restarted and does not know us) fails that
  exchange (a miss) and the next one posts a new hello. The hello at load is awaited
  (``connect``); a hello after tierd went away is posted like the rest, by the
  next exchange or by ``poll`` (every round, idle ones included) once the
  back-off is over, so a restarted tierd is found again without traffic.
  After its welcome every entry known below is gone (``session``): the
  reuse store forgets them, its device entries stay.
- An idle engine still checks tierd: ``poll`` posts an empty lookup once
  nothing was posted for ``keepalive_s``, so a tierd that restarted is told
  hello (its not_ready answer) and one that died times out, within
  ``keepalive_s`` + ``timeout_s`` of it, with traffic or without
  (``ignis:tierd_connected`` follows).
- ``bye`` (``Runtime.close``) is the one exchange that waits: the engine must
  know tierd let go of its memory before freeing it.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

import zmq

from ignis.engine.tier_ops import TierOp
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
"""``TIERD_TO_ENGINE`` less ``StatsReply``: the engine never asks tierd for its stats (the launcher does)."""
QUARANTINE_S = 60.0
KEEPALIVE_S = 5.0
"""An idle engine's check that tierd is still the one that welcomed it (an empty lookup)."""


@dataclass
class _Posted:
    op: TierOp
    deadline: float


class TierClient:
    def __init__(self, endpoint: str, stamp: str, family: str, block_bytes: int, blocks: list[BlockDesc],
                 unit: UnitLayout, timeout_s: float = 10.0, backoff_s: float = 5.0, sync=None,
                 engine_id: str = "default", quarantine_s: float = QUARANTINE_S, clock=time.monotonic,
                 keepalive_s: float = KEEPALIVE_S):
        self.endpoint = endpoint
        self.engine_id = engine_id
        self.stamp = stamp
        self.family = family
        self.block_bytes = block_bytes
        self.blocks = tuple(blocks)
        self.unit = unit
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.quarantine_s = quarantine_s
        self.keepalive_s = keepalive_s
        self.sync = sync  # waits for the engine's queued device work (None on the CPU)
        self.clock = clock
        self._synced = False
        self._req = 0
        self._down_until = 0.0
        self._last_post = clock()
        self._keepalive: tuple[int, float] | None = None  # (req, deadline) of the keep-alive in flight
        self.welcome: Welcome | None = None
        self.connects = 0  # accepted hellos: after each, tierd holds nothing of ours from before
        self._posted: dict[int, _Posted] = {}
        self._hello: int | None = None  # req of a hello in flight
        self._hello_deadline = 0.0
        self._quarantined: dict[int, tuple[TierOp, float]] = {}  # timed-out restores: req -> (op, release at)
        self.channel = connect_dealer(zmq.Context.instance(), endpoint, REPLIES, name="tierd").start()

    # ----- state --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Exchanges posted and not answered (hello included)."""
        return len(self._posted) + (self._hello is not None)

    @property
    def quarantined(self) -> int:
        return len(self._quarantined)

    @property
    def ready(self) -> bool:
        """Welcomed; when not, and the back-off is over, a hello is posted (answered in a later poll)."""
        if self.welcome is None and self._hello is None and self.clock() >= self._down_until:
            self._post_hello()
        return self.welcome is not None

    def device_dirty(self) -> None:
        """The engine queued device work tierd must see: sync again before the next copy is posted."""
        self._synced = False

    # ----- posting ------------------------------------------------------------------

    def _next(self) -> int:
        self._req += 1
        return self._req

    def _hello_msg(self, req: int) -> Hello:
        return Hello(req=req, protocol=TIER_PROTOCOL_VERSION, stamp=self.stamp, family=self.family,
                     block_bytes=self.block_bytes, blocks=self.blocks, unit=self.unit, engine_id=self.engine_id)

    def _post_hello(self) -> None:
        req = self._next()
        self._hello = req
        self._hello_deadline = self.clock() + self.timeout_s
        self.channel.send(self._hello_msg(req))

    def _post(self, what: str, make, copy: bool) -> TierOp:
        op = TierOp(what)
        if not self.ready:
            op.fail("tierd not connected")
            return op
        if copy and self.sync is not None and not self._synced:
            self.sync()
            self._synced = True
        req = self._next()
        self._last_post = self.clock()
        self._posted[req] = _Posted(op, self._last_post + self.timeout_s)
        self.channel.send(make(req))
        return op

    def demote(self, key: str, source: list[tuple[str, int]], kind: str, request_class: str,
               last_used: float) -> TierOp:
        """Copy an entry down; the handle's value is the tier it landed in ("ram"/"disk")."""
        return self._post("demote", lambda req: Demote(
            req=req, key=key, stamp=self.stamp, source=tuple(source), target="auto", kind=kind,
            request_class=request_class, last_used=last_used), copy=True)

    def restore(self, key: str, dest: list[tuple[str, int]], skip: int = 0) -> TierOp:
        """Copy an entry back into ``dest``, all but its first ``skip`` page items; the handle's value is
        the tier it was read from. A miss fails it (the destination is then unused, and free once
        ``memory_free``)."""
        return self._post("restore", lambda req: Restore(req=req, key=key, stamp=self.stamp, dest=tuple(dest),
                                                         skip=skip), copy=True)

    def lookup(self, keys: list[str]) -> TierOp:
        """Where tierd holds each key now: the value maps each to "ram", "disk" or None (gone)."""
        keys = tuple(keys)
        return self._post("lookup", lambda req: Lookup(req=req, stamp=self.stamp, keys=keys), copy=False)

    def drop(self, key: str) -> TierOp:
        return self._post("drop", lambda req: Drop(req=req, key=key), copy=False)

    # ----- replies ------------------------------------------------------------------

    def poll(self, wait_s: float = 0.0) -> int:
        """Complete the handles whose replies arrived; wait up to ``wait_s`` for the first one only when
        something is in flight. Returns how many replies were taken. A new round starts here: the next
        copy posted syncs the device again."""
        self._synced = False
        taken = 0
        block = wait_s > 0 and self.in_flight > 0
        while True:
            try:
                inbox = self.channel.inbox
                reply = (inbox.get(timeout=wait_s) if block and not taken else inbox.get_nowait()).message
            except queue.Empty:
                break
            taken += 1
            self._take(reply)
        self._expire()
        if self.welcome is None:
            self.ready  # noqa: B018 - past the back-off, posts the next hello: an idle engine reconnects too
        elif not self._posted and self._keepalive is None and self.clock() - self._last_post >= self.keepalive_s:
            self._post_keepalive()
        return taken

    def _post_keepalive(self) -> None:
        """An empty lookup, outside ``in_flight`` (nothing waits on it, and a cache reset need not wait for it):
        a restarted tierd answers not_ready, a dead one never answers (a timeout, as any exchange's)."""
        req = self._next()
        self._last_post = self.clock()
        self._keepalive = (req, self._last_post + self.timeout_s)
        self.channel.send(Lookup(req=req, stamp=self.stamp, keys=()))

    def _take(self, reply) -> None:
        if isinstance(reply, ErrorReply):
            log.warning("tierd could not read a message: %s", reply.message)
            return
        req = getattr(reply, "req", None)
        if req is not None and req == self._hello:
            return self._welcomed(reply)
        if self._keepalive is not None and req == self._keepalive[0]:
            self._keepalive = None
            if isinstance(reply, TierRefused) and reply.reason == "not_ready" and self.welcome is not None:
                log.warning("tierd does not know this engine (it restarted?): saying hello again")
                self._lost("not_ready", backoff=False)
            return
        late = self._quarantined.pop(req, None)
        if late is not None:  # the answer to a restore that timed out: tierd is done with its destination
            late[0].release()
            return
        posted = self._posted.pop(req, None)
        if posted is None:
            return  # a late answer to an exchange that failed earlier: nothing waits for it now
        op = posted.op
        if isinstance(reply, TierRefused) and reply.reason == "not_ready":
            log.warning("tierd does not know this engine (it restarted?): saying hello again")
            op.fail("not_ready")
            self._lost("not_ready", backoff=False)  # the next post says hello
            return
        if isinstance(reply, (Demoted, Restored)):
            op.finish(reply.tier)
        elif isinstance(reply, LookupReply):
            op.finish(dict(zip(reply.keys, reply.tiers)))
        elif isinstance(reply, Dropped):
            op.finish(reply.held)
        else:
            if isinstance(reply, (Missing, TierRefused)):
                # a full tier answers no_room to every demote it cannot take (tierd counts them:
                # ignis:tierd_refusals_total): routine under pressure, so not a line each
                level = logging.DEBUG if reply.reason == "no_room" else logging.INFO
                log.log(level, "tierd: %s of %s: %s", op.what, getattr(reply, "key", ""), reply.reason)
            op.fail(getattr(reply, "reason", "unexpected reply"))

    def _welcomed(self, reply) -> None:
        self._hello = None
        if isinstance(reply, Welcome):
            self.welcome = reply
            self.connects += 1
            log.info("tierd connected: arena %d bytes (%d locked), KV-disk %d bytes", reply.arena_bytes,
                     reply.locked_bytes, reply.disk_bytes)
            quarantined, self._quarantined = self._quarantined, {}
            for op, _ in quarantined.values():  # tierd finished its copies before it answered
                op.release()
            return
        if isinstance(reply, TierRefused):
            log.error("tierd refused hello: %s", reply.message)
        self._down_until = self.clock() + self.backoff_s

    def _expire(self) -> None:
        now = self.clock()
        if self._keepalive is not None and now >= self._keepalive[1]:
            self._keepalive = None
            if self.welcome is not None:
                log.warning("tierd did not answer a keep-alive in %.1fs: lower tiers off for %gs", self.timeout_s,
                            self.backoff_s)
                self._lost("timeout", backoff=True)
        if self._hello is not None and now >= self._hello_deadline:
            log.warning("tierd did not answer Hello in %.1fs: lower tiers off for %gs", self.timeout_s,
                        self.backoff_s)
            self._hello = None
            self._down_until = now + self.backoff_s
        late = [req for req, p in self._posted.items() if now >= p.deadline]
        if late:
            p = self._posted[late[0]]
            name = {"demote": "Demote", "restore": "Restore", "lookup": "Lookup", "drop": "Drop"}[p.op.what]
            log.warning("tierd did not answer %s in %.1fs: lower tiers off for %gs", name, self.timeout_s,
                        self.backoff_s)
            self._lost("timeout", backoff=True)
        for req, (op, until) in list(self._quarantined.items()):
            if now >= until:
                log.warning("a restore tierd never answered: its pages and slot are used again after %.0f s",
                            self.quarantine_s)
                del self._quarantined[req]
                op.release()

    def _lost(self, reason: str, backoff: bool) -> None:
        """tierd is gone (or forgot us): every exchange in flight fails; restores' destinations stay
        quarantined (see the module docstring)."""
        self.welcome = None
        if backoff:
            self._down_until = self.clock() + self.backoff_s
        posted, self._posted = self._posted, {}
        for req, p in posted.items():
            restore = p.op.what == "restore"
            if restore:
                self._quarantined[req] = (p.op, self.clock() + self.quarantine_s)
            p.op.fail(reason, memory_free=not restore)

    # ----- the waiting exchanges -----------------------------------------------------

    def _await(self, msg, req: int):
        """Send ``msg`` and wait for its reply (load and close only); other replies are handled as usual."""
        self.channel.send(msg)
        deadline = self.clock() + self.timeout_s
        while True:
            left = deadline - self.clock()
            if left <= 0:
                log.warning("tierd did not answer %s in %.1fs: lower tiers off for %gs", type(msg).__name__,
                            self.timeout_s, self.backoff_s)
                self._down_until = self.clock() + self.backoff_s
                self.welcome = None
                return None
            try:
                reply = self.channel.get(timeout=left).message
            except queue.Empty:
                continue
            if getattr(reply, "req", None) == req:
                return reply
            self._take(reply)

    def wait(self, op: TierOp, timeout_s: float | None = None) -> TierOp:
        """Poll until ``op`` is done (tests and tools; a round never calls it)."""
        deadline = self.clock() + (self.timeout_s if timeout_s is None else timeout_s) + 1.0
        while op.pending and self.clock() < deadline:
            self.poll(0.05)
        return op

    def connect(self) -> bool:
        """Say hello and wait for the answer (at load): every entry tierd held for us is gone."""
        req = self._next()
        self._hello = req
        self._hello_deadline = self.clock() + self.timeout_s
        reply = self._await(self._hello_msg(req), req)
        if reply is None:
            self._hello = None
            return False
        self._welcomed(reply)
        return self.welcome is not None

    def bye(self) -> bool:
        """Detach for good before the engine frees its memory: tierd lets its copies in flight finish,
        drops every entry it held for us and unmaps the pool and slots, then answers. False when it
        did not answer (gone, or slow): the caller frees its memory anyway."""
        if self.welcome is None:
            return True  # tierd holds no mapping of ours
        req = self._next()
        reply = self._await(Bye(req=req), req)
        self.welcome = None
        return isinstance(reply, Detached)

    def close(self) -> None:
        self.channel.close()
