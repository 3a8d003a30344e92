"""The tier daemon's serving loop: one ROUTER socket, one loop thread, copy results posted back to it.

::

    engine ──frames──> Channel I/O thread ──inbox──┐
                                                   v
                    loop thread: hello / checks / TierStore ──submit──> copier, disk threads
                                 ^                                         │
                                 └──────────── posted callbacks <──────────┘

The loop checks every request before anything moves: a hello must come
first and from the same peer, the tier protocol must match, one engine is
served at a time (a hello naming another engine is refused; the same engine
from a new connection is a restart: it keeps the arena mapped, its entries dropped), a request's
stamp must be the hello's, refs must fit the exported blocks. An engine's
``Bye`` (idle unload, model switch, stop) drops its entries and gives the
arena's memory back (``Arena.release``: unlocked, unmapped); the next hello
maps and locks it again before it is welcomed (refused, ``no_room``, when
the lock is required and fails: the engine serves without the lower tiers
and says hello again later). Garbage is
answered by the channel with ``ErrorReply``; an unexpected error in a
handler is logged and answered, and the loop keeps serving. SIGTERM lets
copies in flight finish, drops everything, and returns 0.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from pathlib import Path

import zmq

from ignis.shared.tier_wire import (
    ENGINE_TO_TIERD,
    TIER_PROTOCOL_VERSION,
    Bye,
    Demote,
    Detached,
    Drop,
    Hello,
    Lookup,
    Restore,
    Stats,
    StatsReply,
    TierRefused,
    Welcome,
)
from ignis.shared.sdnotify import STALL_S
from ignis.shared.stop_request import StopRequest
from ignis.shared.zmq_queues import bind_router
from ignis.tierd import disk as kvdisk
from ignis.tierd.arena import Arena, MlockError
from ignis.tierd.config import TierdConfig
from ignis.tierd.memory_map import EngineMemory, LayoutError
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.store import TierStore

log = logging.getLogger("ignis.tierd")

_STOP_WAIT_S = 30.0


class TierServer:
    def __init__(self, config: TierdConfig, arena: Arena, endpoint: str, disk_dir: Path | None,
                 metrics: TierdMetrics, mac_key: bytes = b""):
        self.config = config
        self.mac_key = mac_key  # KV-disk files' MAC key (empty only when KV-disk is off for good)
        self.arena = arena
        self.endpoint = endpoint
        self.disk_dir = disk_dir
        self.metrics = metrics
        self.store: TierStore | None = None
        self._abandoned: TierStore | None = None  # an ended session whose copies outlasted the wait
        self.hello: Hello | None = None
        self.peer: bytes | None = None
        self._posted: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._last_turn = time.monotonic()
        self._stopping = StopRequest()  # set by the signal handler: takes no lock
        self.channel = bind_router(zmq.Context.instance(), endpoint, ENGINE_TO_TIERD, name="tierd",
                                   notify=self._wake.set)
        self._gauges()

    # ----- lifecycle -------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        """SIGTERM; runs as a signal handler, so it takes no lock (the loop notices within 0.1 s)."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_stop)  # a closed terminal: stop as cleanly as on SIGTERM

    def post(self, fn) -> None:
        """Called by worker threads: run ``fn`` on the loop."""
        self._posted.put(fn)
        self._wake.set()

    def alive(self) -> bool:
        """The loop turned recently (systemd's watchdog is pinged only while it does)."""
        return time.monotonic() - self._last_turn < STALL_S

    def serve_forever(self) -> int:
        self.channel.start()
        try:
            while not self._stopping.is_set():
                self._last_turn = time.monotonic()
                self._wake.wait(0.1)
                self._wake.clear()
                self._run_posted()
                self._drain_inbox()
                if self._abandoned is not None:
                    self._copies_left()
            self._end_session(_STOP_WAIT_S)
        finally:
            time.sleep(0.05)  # let the last replies leave
            self.channel.close()
        log.info("tierd stopped")
        return 0

    def _run_posted(self) -> None:
        while True:
            try:
                fn = self._posted.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:
                log.exception("error finishing a copy; tierd keeps serving")
            self._gauges()

    def _drain_inbox(self) -> None:
        self._count_garbage()  # first: frames refused before a request are counted before it is answered
        while True:
            try:
                env = self.channel.inbox.get_nowait()
            except queue.Empty:
                break
            self.handle(env.peer, env.message)
        self._count_garbage()

    def _count_garbage(self) -> None:
        self.metrics.wire_errors.sync(self.channel.garbage_count, "engine")

    def _wait_in_flight(self, wait_s: float) -> None:
        """Let copies in flight finish (their replies go out), for at most ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while self.store.in_flight and time.monotonic() < deadline:
            self._wake.wait(0.05)
            self._wake.clear()
            self._run_posted()

    def _end_session(self, wait_s: float) -> None:
        """Let copies in flight finish (their replies go out), then drop every entry."""
        if self.store is None:
            return
        self._wait_in_flight(wait_s)
        if self.store.in_flight:
            log.error("%d copies still in flight after %.0f s; their entries are abandoned",
                      self.store.in_flight, wait_s)
        if not self.store.close():
            self._abandoned = self.store
            log.error("an abandoned copy is still running: the arena goes to no new session (a hello is refused "
                      "as busy) until it returns")
        self.store = None
        if self.disk_dir is not None:
            error = kvdisk.wipe_dir(self.disk_dir, remove=False)
            if error:
                log.error("cannot wipe the KV-disk directory %s: %s (its files stay until a wipe succeeds)",
                          self.disk_dir, error)
        self._gauges()

    # ----- requests --------------------------------------------------------------

    def handle(self, peer: bytes, msg) -> None:
        try:
            self._handle(peer, msg)
        except Exception as exc:  # a handler bug must not take the loop down
            log.exception("error handling %s", type(msg).__name__)
            key = getattr(msg, "key", "")
            op = {Hello: "hello", Demote: "demote", Restore: "restore", Drop: "drop", Bye: "bye"}.get(type(msg),
                                                                                                 "lookup")
            if hasattr(msg, "req"):
                self._refuse(peer, msg.req, op, key, "bad_request", f"tierd error: {exc}")
        self._gauges()

    def _handle(self, peer: bytes, msg) -> None:
        if isinstance(msg, Stats):
            return self.channel.send(StatsReply(self.stats()), peer)
        if isinstance(msg, Hello):
            return self._hello(peer, msg)
        op = {Demote: "demote", Restore: "restore", Drop: "drop", Lookup: "lookup", Bye: "bye"}[type(msg)]
        key = getattr(msg, "key", "")
        if self.store is None or peer != self.peer:
            why = "no engine has said hello" if self.store is None else "another engine said hello after this one"
            return self._refuse(peer, msg.req, op, key, "not_ready", f"{why}; send tier_hello first")
        if isinstance(msg, Bye):
            return self._bye(peer, msg)
        if isinstance(msg, Drop):
            return self.store.drop(peer, msg)
        if msg.stamp != self.hello.stamp:  # before any byte moves
            return self._refuse(peer, msg.req, op, key, "stamp",
                                f"stamp {msg.stamp!r} differs from this session's {self.hello.stamp!r}")
        if isinstance(msg, Lookup):
            return self.channel.send(self.store.lookup(msg), peer)
        try:
            resolved = self.store.memory.resolve(msg.source if op == "demote" else msg.dest,
                                                 "source" if op == "demote" else "dest")
        except LayoutError as e:
            return self._refuse(peer, msg.req, op, key, "bad_request", str(e))
        if op == "demote":
            self.store.demote(peer, msg, resolved)
        else:
            self.store.restore(peer, msg, resolved)

    def _refuse(self, peer: bytes, req: int, op: str, key: str, reason: str, message: str) -> None:
        self.metrics.refused(reason)
        self.channel.send(TierRefused(req, op, key, reason, message[:4000]), peer)

    def _hello(self, peer: bytes, msg: Hello) -> None:
        """Checked in full before any state changes: a refused hello leaves the attached engine served."""
        if msg.protocol != TIER_PROTOCOL_VERSION:
            return self._refuse(peer, msg.req, "hello", "", "protocol",
                                f"the engine speaks tier protocol {msg.protocol}; this tierd speaks "
                                f"{TIER_PROTOCOL_VERSION}: run an engine and tierd of the same ignis version")
        attached = self.hello
        if attached is not None and peer != self.peer and msg.engine_id != attached.engine_id:
            return self._refuse(peer, msg.req, "hello", "", "busy",
                                f"this tierd serves engine {attached.engine_id!r}; it serves one engine at a time "
                                f"(engine {msg.engine_id!r} needs its own instance's tierd)")
        try:
            memory = EngineMemory(msg.blocks, msg.unit)
        except LayoutError as e:
            return self._refuse(peer, msg.req, "hello", "", "bad_layout", str(e))
        if attached is not None and peer != self.peer and self._is_restart(msg):
            self._wait_in_flight(_STOP_WAIT_S)
            if self.store.can_rebind(memory):
                dropped = self.store.rebind(memory)
                self.hello, self.peer = msg, peer
                log.info("engine %r restarted: the arena stays mapped, its %d entries are dropped (the new "
                         "process has no record of their tokens to find them by)", msg.engine_id, dropped)
                return self._welcome(peer, msg, self.store.disk.ceiling if self.store.disk else 0)
        disk_bytes = self.config.resolve_disk_bytes(msg.family)  # disk_dir is None only for an explicit 0
        self._end_session(_STOP_WAIT_S)  # a new session frees everything the last one left
        self.hello = self.peer = None
        if self._copies_left(release_arena=False):
            memory.close()
            return self._refuse(peer, msg.req, "hello", "", "busy",
                                "the last session's abandoned copies are still running and may still write into "
                                "the arena: no new session until they return (the engine says hello again)")
        disk = None
        if not self.arena.mapped:
            try:
                self.arena.acquire()
            except (MlockError, OSError) as e:
                memory.close()
                return self._refuse(peer, msg.req, "hello", "", "no_room", f"cannot take the arena back: {e}")
            log.info("arena mapped again: %d bytes (%d locked)", self.arena.nbytes, self.arena.locked_bytes)
        try:
            if memory.uses_cuda:
                self.arena.pin_for_cuda()
        except (OSError, ImportError) as e:
            memory.close()
            return self._refuse(peer, msg.req, "hello", "", "bad_layout", str(e))
        if disk_bytes:
            try:
                disk = kvdisk.DiskTier(kvdisk.prepare_dir(self.disk_dir), disk_bytes, self.mac_key)
            except (kvdisk.ForeignFilesError, OSError, ImportError) as e:
                # KV-RAM serves without it: a disk problem never costs the arena
                self.metrics.disk_write_failed("io_error")
                log.error("KV-disk is off for this engine's session: %s", e)
        elif self.disk_dir is not None:  # the directory stays (empty) until exit: its lock is on it
            kvdisk.wipe_dir(self.disk_dir, remove=False)
        self.store = TierStore(arena=self.arena, block_bytes=msg.block_bytes, memory=memory, disk=disk,
                               stamp=msg.stamp, ttl=float(self.config.reuse_retained_interactive_ttl),
                               metrics=self.metrics, post=self.post, reply=self._reply, again=self.handle)
        self.hello, self.peer = msg, peer
        log.info("engine %r hello: family %s, stamp %s, %d arena blocks of %d bytes, KV-disk %s", msg.engine_id,
                 msg.family, msg.stamp, self.store.alloc.n, msg.block_bytes,
                 f"{disk_bytes} bytes" if disk else "off")
        self._welcome(peer, msg, disk_bytes if disk else 0)

    def _is_restart(self, msg: Hello) -> bool:
        """``msg`` is the attached engine restarted: same identity and the same entry format."""
        a = self.hello
        return (msg.engine_id, msg.stamp, msg.family, msg.block_bytes) == (a.engine_id, a.stamp, a.family,
                                                                          a.block_bytes)

    def _welcome(self, peer: bytes, msg: Hello, disk_bytes: int) -> None:
        self.channel.send(Welcome(msg.req, TIER_PROTOCOL_VERSION, self.arena.nbytes, self.store.alloc.n,
                                  msg.block_bytes, self.arena.locked_bytes, disk_bytes), peer)

    def _bye(self, peer: bytes, msg: Bye) -> None:
        entries = len(self.store.entries)
        log.info("engine %r detached: %d entries dropped", self.hello.engine_id, entries)
        self._end_session(_STOP_WAIT_S)
        self.hello = self.peer = None
        if self._copies_left(release_arena=False):
            log.warning("arena kept mapped: an abandoned copy may still write into it")
        else:
            self._release_arena()
        self.channel.send(Detached(msg.req, entries), peer)

    def _copies_left(self, release_arena: bool = True) -> bool:
        """A copy abandoned at the end of a session still runs. Once none does, what it held is closed,
        and (``release_arena``) the arena is released if no engine is attached, as a bye does."""
        if self._abandoned is not None and not self._abandoned.copies_running:
            self._abandoned.close_resources()
            self._abandoned = None
            log.info("the abandoned copies have returned: the arena is free for a new session")
            if release_arena and self.hello is None and self.store is None and self.arena.mapped:
                self._release_arena()
        return self._abandoned is not None

    def _release_arena(self) -> None:
        """No engine attached: no locked memory until the next hello."""
        self.arena.release()
        log.info("arena released (%d bytes unlocked and unmapped) until the next engine says hello",
                 self.arena.nbytes)
        self._gauges()

    def _reply(self, peer: bytes, msg) -> None:
        self.channel.send(msg, peer)

    # ----- reporting ---------------------------------------------------------------

    def stats(self) -> dict:
        s = self.store
        out = {
            "arena_bytes": self.arena.nbytes, "arena_mapped_bytes": self.arena.mapped_bytes,
            "arena_locked_bytes": self.arena.locked_bytes,
            "arena_unlocked_bytes": self.arena.unlocked_bytes, "wire_errors": self.channel.garbage_count,
            "ready": int(s is not None),
        }
        if s is not None:
            out.update({
                "arena_blocks": s.alloc.n, "arena_blocks_free": s.alloc.free_count,
                "arena_used_bytes": s.alloc.used_count * s.block_bytes, "entries": len(s.entries),
                "in_flight": s.in_flight, "room_queue": len(s.room),
                "disk_ceiling_bytes": s.disk.ceiling if s.disk else 0,
                "disk_used_bytes": s.disk.used if s.disk else 0,
                "disk_healthy": int(bool(s.disk and s.disk.healthy)),
            })
            for (tier, kind), n in s.counts().items():
                out[f"entries_{tier}_{kind}"] = n
        return out

    def _gauges(self) -> None:
        m, s = self.metrics, self.store
        m.arena_bytes.set(self.arena.nbytes)
        m.arena_mapped.set(self.arena.mapped_bytes)
        m.arena_locked.set(self.arena.locked_bytes)
        m.arena_unlocked.set(self.arena.unlocked_bytes)
        m.arena_used.set(s.alloc.used_count * s.block_bytes if s else 0)
        m.disk_used.set(s.disk.used if s and s.disk else 0)
        m.disk_ceiling.set(s.disk.ceiling if s and s.disk else 0)
        m.copies_in_flight.set(s.in_flight if s else 0)
        m.set_entries(s.counts() if s else {})
