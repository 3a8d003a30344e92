"""The entries of one engine session: where each key's bytes are, and the copy flows that move them.

Runs on the server's loop thread only; copies and file I/O run on two
``Worker`` threads (``copier``: engine <-> arena; ``disk``: every KV-disk
read and write) and come back as callbacks on the loop. Flows:

    demote -> room queue (FIFO) -> [plan room: discard / spill victims, wait for spills]
           -> arena RESERVED -> FILLING -> RESIDENT          -> Demoted(ram)
           or (target disk, or auto and no arena room)
           -> disk  RESERVED -> FILLING -> RESIDENT          -> Demoted(disk)
    demote of a key resting on KV-disk, with free arena room (the engine let go of the copy it restored)
           -> arena RESERVED -> FILLING -> RESIDENT, file deleted -> Demoted(ram)
           or no free room: nothing moves                    -> Demoted(disk)
    restore -> arena RESIDENT -> READING -> RESIDENT          -> Restored(ram)
            or disk RESIDENT -> READING -> verify chunk, copy -> Restored(disk) | Missing(corrupt)
    drop    -> every slot FREE                                -> Dropped

A request on a busy key waits on that entry and is handled again, in
order, when it is idle or gone. Only the head of the room queue plans and
waits, so blocks freed by its spills go to it. ``check`` is the integrity
check: every arena block and disk byte is accounted to exactly one entry.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ignis.shared.tier_wire import Demote, Demoted, Drop, Dropped, Lookup, LookupReply, Missing, Restore, Restored, TierRefused
from ignis.tierd import disk as kvdisk
from ignis.tierd import disk_io as kvdisk_io
from ignis.tierd.arena import Arena, BlockAllocator
from ignis.tierd.copier import Worker, copy_threads, make_backend, plan_copy, read_into_engine, write_from_engine
from ignis.tierd.memory_map import EngineMemory, Resolved
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.ranking import Candidate, DiskView, Rank, RoomPlan, plan_arena_room, plan_disk_room
from ignis.tierd.slots import Entry, SlotState

log = logging.getLogger("ignis.tierd")
S = SlotState


@dataclass
class _Waiting:
    """A demote at the room queue; ``spills`` are the victims whose blocks it waits for."""

    peer: bytes
    msg: Demote
    entry: Entry
    resolved: Resolved
    need: int
    spills: set[str] = field(default_factory=set)
    promote: bool = False  # the entry is on KV-disk already: filled into the arena from the engine's copy


class TierStore:
    def __init__(self, *, arena: Arena, block_bytes: int, memory: EngineMemory, disk: kvdisk.DiskTier | None,
                 stamp: str, ttl: float, metrics: TierdMetrics, post: Callable, reply: Callable, again: Callable,
                 clock: Callable[[], float] = time.time):
        self.arena = arena
        self.block_bytes = block_bytes
        self.alloc = BlockAllocator(arena.nbytes // block_bytes)
        self.memory = memory
        self.disk = disk
        self.stamp = stamp
        self.ttl = ttl
        self.metrics = metrics
        self.reply = reply  # reply(peer, message)
        self.again = again  # again(peer, request): handle a waiting request once more
        self.clock = clock
        self.backend = make_backend(memory.cuda_device, copy_threads())  # copier thread
        self.disk_backend = make_backend(memory.cuda_device)  # disk thread (its own CUDA stream)
        self.copier = Worker("copier", post)
        self.disk_io = Worker("disk", post) if disk is not None else None
        self.entries: dict[str, Entry] = {}
        self.room: deque[_Waiting] = deque()
        self._told_too_large: set[str] = set()  # tiers whose too-large refusal was logged this session
        self._resources_closed = False
        self._seq = 0
        # the disk thread's staging windows and I/O threads, touched now and reused for every file
        self.disk_files = kvdisk_io.DiskIO(disk.chunk, copy_threads(), disk.direct) if disk is not None else None

    # ----- requests (the server checked hello, stamp and refs) -------------------

    def demote(self, peer: bytes, msg: Demote, resolved: Resolved) -> None:
        e = self.entries.get(msg.key)
        if e is not None:
            if e.busy:
                e.waiting.append((peer, msg))
                return
            # Same key, same content: the latest ranking is kept, and nothing moves unless the entry rests
            # on KV-disk and free arena room can take it (the engine's copy is as good as the file, and a
            # read from KV-RAM is the faster one).
            e.kind, e.request_class, e.last_used = msg.kind, msg.request_class, max(e.last_used, msg.last_used)
            if self._may_promote(msg, e, resolved):
                e.pending = True
                return self._fill(_Waiting(peer, msg, e, resolved, self._blocks_for(e), promote=True))
            self.reply(peer, Demoted(msg.req, e.key, e.tier, e.nbytes))
            return
        if msg.target == "disk" and self._disk_view() is None:
            return self._refuse(peer, msg, "no_disk", "target disk, but KV-disk is off (or failed) on this tierd")
        self._seq += 1
        header = kvdisk.encode_header(msg.key, self.stamp, resolved.nbytes, resolved.shape,
                                      self.disk.session if self.disk else "")
        chunk = self.disk.chunk if self.disk else kvdisk.CHUNK_BYTES
        e = Entry(msg.key, resolved.shape, resolved.nbytes, msg.kind, msg.request_class, msg.last_used, self._seq,
                  header=header, file_bytes=kvdisk.file_bytes(header, resolved.nbytes, chunk))
        self.entries[msg.key] = e
        if msg.target == "disk":
            return self._to_disk(peer, msg, e, resolved)
        self.room.append(_Waiting(peer, msg, e, resolved, self._blocks_for(e)))
        self._pump()

    def restore(self, peer: bytes, msg: Restore, resolved: Resolved) -> None:
        e = self.entries.get(msg.key)
        if e is None:
            self.metrics.missing("unknown")
            return self.reply(peer, Missing(msg.req, msg.key, "unknown", "tierd holds no entry with this key"))
        if e.busy:
            e.waiting.append((peer, msg))
            return
        skipped = e.shape[:msg.skip]
        if resolved.shape != e.shape[msg.skip:] or any(name != self.memory.unit.pages for name in skipped):
            return self._refuse(peer, msg, "bad_request",
                                f"dest names blocks {_brief(resolved.shape)} after skipping {msg.skip}; the entry "
                                f"was demoted from {_brief(e.shape)} (same blocks, same order needed; only page "
                                f"items may be skipped)")
        start = sum(self.memory.blocks[name].item_total for name in skipped)  # payload bytes not copied
        if e.arena.state is S.RESIDENT:
            e.arena.move(S.READING)
            spans = plan_copy(resolved.items, e.blocks, self.block_bytes, start)
            self.copier.submit(lambda: self.backend.scatter(spans, self.arena.view),
                               lambda r, err, s: self._restored(peer, msg, e, "ram", err, s, start))
        else:
            e.disk.move(S.READING)
            job = partial(read_into_engine, self.disk_backend, resolved.items, self.disk.file_path(e.key), e.header,
                          e.nbytes, self.disk_files, self.disk.mac_key, start)
            self.disk_io.submit(job, lambda r, err, s: self._restored(peer, msg, e, "disk", err, s, start))

    def drop(self, peer: bytes, msg: Drop) -> None:
        e = self.entries.get(msg.key)
        if e is None:
            return self.reply(peer, Dropped(msg.req, msg.key, False))
        if e.busy:
            e.waiting.append((peer, msg))
            return
        self._remove(e)
        self.reply(peer, Dropped(msg.req, msg.key, True))

    def lookup(self, msg: Lookup) -> LookupReply:
        """Where ``msg.keys`` are. The engine lists them longest first, so the first held in each tier is
        the one a waiting request would restore from there: it is ranked as used now, so room made for
        that restore (the engine demotes others to free the pages it needs) is not taken from the very
        entry being restored, among entries of its kind and class. The shorter ones (a conversation's
        earlier checkpoints) keep their rank."""
        tiers, sizes = [], []
        now = self.clock()
        touched: set[str] = set()
        for k in msg.keys:
            e = self.entries.get(k)
            tier = e.tier if e is not None else None
            if tier is not None and tier not in touched:
                touched.add(tier)
                e.last_used = max(e.last_used, now)
            tiers.append(tier)
            sizes.append(e.nbytes if tier else 0)
        return LookupReply(msg.req, msg.keys, tuple(tiers), tuple(sizes))

    # ----- room ------------------------------------------------------------------

    def _rank(self, e: Entry) -> Rank:
        return Rank(e.kind, e.request_class, e.last_used, e.seq)

    def _disk_view(self) -> DiskView | None:
        if self.disk is None or not self.disk.healthy:
            return None
        cands = tuple(Candidate(e.key, self._rank(e), e.file_bytes) for e in self.entries.values()
                      if e.idle_in == "disk")
        return DiskView(self.disk.free, cands)

    def _pump(self) -> None:
        """Serve the room queue from its head until it is empty or the head waits for spills."""
        while self.room and not self.room[0].spills:
            w = self.room[0]
            if self.alloc.free_count >= w.need:
                self.room.popleft()
                self._fill(w)
                continue
            plan = None
            if w.need <= self.alloc.n:
                cands = [Candidate(e.key, self._rank(e), len(e.blocks), e.file_bytes)
                         for e in self.entries.values() if e.idle_in == "ram"]
                plan = plan_arena_room(self.alloc.free_count, w.need, self._rank(w.entry), cands,
                                       self._disk_view(), self.clock(), self.ttl)
            if plan is None:
                self.room.popleft()
                if w.msg.target == "auto" and self._disk_view() is not None:
                    self._to_disk(w.peer, w.msg, w.entry, w.resolved)
                elif w.need > self.alloc.n:
                    self._refuse_new(w.peer, w.msg, w.entry, "no_room", self._too_large(
                        "KV-RAM", w.need * self.block_bytes, self.alloc.n * self.block_bytes,
                        "--reuse-kv-host-pool-bytes"))
                else:
                    where = "" if self._disk_view() else " (KV-disk off)"
                    self._refuse_new(w.peer, w.msg, w.entry, "no_room",
                                     f"no KV-RAM room for {w.need} blocks: every entry held ranks at least as "
                                     f"high, or is live work that cannot move down{where}")
                continue
            self._apply(plan)
            w.spills = set(plan.spills)

    def _apply(self, plan: RoomPlan) -> None:
        disk_down = self.disk is not None and not self.disk.healthy  # the plan discards what it would spill
        for key in plan.disk_discards + plan.arena_discards:
            e = self.entries[key]
            self.metrics.discarded(e.idle_in, e.kind, disk_down=disk_down and e.idle_in == "ram")
            self._remove(e)
        for key in plan.spills:
            self._spill(self.entries[key])

    def _remove(self, e: Entry) -> None:
        """Forget an idle entry in every tier."""
        if e.arena.state is S.RESIDENT:
            e.arena.move(S.FREE)
            self.alloc.free(e.blocks)
            e.blocks = []
        if e.disk.state is S.RESIDENT:
            e.disk.move(S.FREE)
            self.disk.release(e.file_bytes)
            self._unlink(e.key)
        del self.entries[e.key]
        self._settle(e)

    def _unlink(self, key: str) -> None:
        """Delete an entry's file; one that cannot be deleted is forgotten all the same (each failure counted,
        logged once a retry period: KV-disk then takes no writes for a while)."""
        healthy = self.disk.healthy
        err = self.disk.remove(key)
        if err is None:
            return
        self.metrics.disk_write_failed(_write_failure_reason(err))
        if healthy:
            log.error("cannot delete KV-disk file of %s (%s); KV-disk takes no writes for %.0f s, then tries "
                      "again", key, err, self.disk.retry_after_s)

    def _settle(self, e: Entry) -> None:
        waiting, e.waiting = e.waiting, []
        for peer, msg in waiting:
            self.again(peer, msg)

    def _refuse(self, peer: bytes, msg, reason: str, message: str) -> None:
        self.metrics.refused(reason)
        op = "demote" if isinstance(msg, Demote) else "restore"
        self.reply(peer, TierRefused(msg.req, op, msg.key, reason, message))

    def _too_large(self, tier: str, nbytes: int, whole: int, flag: str) -> str:
        """The refusal of an entry larger than the whole tier (it can never be kept there); logged once a
        session per tier, as an operator can act on it (not where the operator turned the tier off)."""
        if whole == 0 and tier == "KV-RAM" and self.arena.nbytes == 0:
            return f"{tier} is off ({flag} 0)"
        message = (f"an entry of {nbytes} bytes is larger than the whole {tier} ({whole} bytes): no entry "
                   f"that size is ever kept there (raise {flag})")
        if tier not in self._told_too_large:
            self._told_too_large.add(tier)
            log.warning("%s", message)
        return message

    def _refuse_new(self, peer: bytes, msg: Demote, e: Entry, reason: str, message: str) -> None:
        del self.entries[e.key]
        self._refuse(peer, msg, reason, message)
        self._settle(e)

    # ----- copies in -------------------------------------------------------------

    def _blocks_for(self, e: Entry) -> int:
        return -(-e.nbytes // self.block_bytes)

    def _may_promote(self, msg: Demote, e: Entry, resolved: Resolved) -> bool:
        """Whether a demote of idle ``e``, held on KV-disk only, fills it back into the arena: only into
        free room no demote waits for. A promotion never pushes another entry down: over a working set
        larger than the arena, that would make every restore a KV-disk read and every demote a KV-disk
        write (each entry coming up would push out the next one to be read)."""
        return (e.tier == "disk" and msg.target != "disk" and resolved.shape == e.shape
                and resolved.nbytes == e.nbytes and not self.room
                and self.alloc.free_count >= self._blocks_for(e))

    def _stays_on_disk(self, w: _Waiting) -> None:
        """A promotion whose fill failed: the entry rests on KV-disk as before."""
        w.entry.pending = False
        self.reply(w.peer, Demoted(w.msg.req, w.entry.key, "disk", w.entry.nbytes))
        self._settle(w.entry)

    def _fill(self, w: _Waiting) -> None:
        e = w.entry
        e.blocks = self.alloc.allocate(w.need)
        e.arena.move(S.RESERVED)
        spans = plan_copy(w.resolved.items, e.blocks, self.block_bytes)
        e.arena.move(S.FILLING)
        self.copier.submit(lambda: self.backend.gather(spans, self.arena.view),
                           lambda r, err, s: self._filled(w, err, s))

    def _filled(self, w: _Waiting, err: BaseException | None, seconds: float) -> None:
        e = w.entry
        if err is None:
            e.arena.move(S.RESIDENT)
            e.pending = False
            if w.promote:  # one tier holds an idle entry: the file goes
                e.disk.move(S.FREE)
                self.disk.release(e.file_bytes)
                self._unlink(e.key)
                self.metrics.promoted(e.kind)  # a hand-down of an entry held already: not a new demotion
            else:
                self.metrics.demoted("ram", e.kind)
            self.metrics.copied("engine_to_ram", e.nbytes, seconds)
            self.reply(w.peer, Demoted(w.msg.req, e.key, "ram", e.nbytes))
            return self._settle(e)
        log.error("copy of %s into KV-RAM failed: %s", e.key, err)
        e.arena.move(S.FREE)
        self.alloc.free(e.blocks)
        e.blocks = []
        if w.promote:
            return self._stays_on_disk(w)
        self._refuse_new(w.peer, w.msg, e, "copy_failed", f"copy into KV-RAM failed: {err}")

    def _to_disk(self, peer: bytes, msg: Demote, e: Entry, resolved: Resolved) -> None:
        if e.file_bytes > self.disk.ceiling:
            return self._refuse_new(peer, msg, e, "no_room", self._too_large(
                "KV-disk", e.file_bytes, self.disk.ceiling, "--kv-disk-bytes"))
        plan = plan_disk_room(self._disk_view(), e.file_bytes, self._rank(e), self.clock(), self.ttl)
        if plan is None:
            return self._refuse_new(peer, msg, e, "no_room",
                                    f"no KV-disk room for {e.file_bytes} bytes: it is full of live work "
                                    f"or of entries ranked as high")
        self._apply(plan)
        e.disk.move(S.RESERVED)
        self.disk.reserve(e.file_bytes)
        e.disk.move(S.FILLING)
        job = partial(write_from_engine, self.disk_backend, resolved.items, self.disk.file_path(e.key), e.header,
                      e.nbytes, self.disk_files, self.disk.mac_key)
        self.disk_io.submit(job, lambda r, err, s: self._written(peer, msg, e, err, s))

    def _written(self, peer: bytes, msg: Demote, e: Entry, err: BaseException | None, seconds: float) -> None:
        if err is None:
            e.disk.move(S.RESIDENT)
            e.pending = False
            self.metrics.copied("engine_to_disk", e.nbytes, seconds)
            self.metrics.demoted("disk", e.kind)
            self.reply(peer, Demoted(msg.req, e.key, "disk", e.nbytes))
            return self._settle(e)
        self._disk_failed(e, err)
        self._refuse_new(peer, msg, e, "copy_failed", f"KV-disk write failed: {err}")

    def _disk_failed(self, e: Entry, err: BaseException) -> None:
        self.disk.failed()
        self.metrics.disk_write_failed(_write_failure_reason(err))
        log.error("KV-disk write of %s failed (%s); KV-disk takes no writes for %.0f s, then tries again",
                  e.key, err, self.disk.retry_after_s)
        e.disk.move(S.FREE)
        self.disk.release(e.file_bytes)
        self._unlink(e.key)
        if self.disk.vanished():
            self._disk_vanished()

    def _disk_vanished(self) -> None:
        """The KV-disk directory went away while serving: its entries are forgotten (their files went with
        it), and the directory is made again, so KV-disk comes back after its retry period."""
        gone = [x for x in self.entries.values() if x.disk.state is S.RESIDENT and not x.busy and x.tier == "disk"]
        for x in gone:
            self.metrics.discarded("disk", x.kind)
            x.disk.move(S.FREE)
            self.disk.release(x.file_bytes)
            del self.entries[x.key]
            self._settle(x)
        for x in self.entries.values():  # entries in both tiers keep their arena copy
            if x.disk.state is S.RESIDENT and not x.busy:
                x.disk.move(S.FREE)
                self.disk.release(x.file_bytes)
        why = self.disk.recreate()
        if why:
            log.error("the KV-disk directory %s is gone (%d entries forgotten) and cannot be made again: %s; "
                      "KV-disk tries again in %.0f s", self.disk.path, len(gone), why, self.disk.retry_after_s)
        else:
            log.error("the KV-disk directory %s was removed while serving: %d entries forgotten, the directory "
                      "made again; KV-disk writes again in %.0f s", self.disk.path, len(gone),
                      self.disk.retry_after_s)

    def _spill(self, e: Entry) -> None:
        e.arena.move(S.SPILLING)
        e.disk.move(S.RESERVED)
        self.disk.reserve(e.file_bytes)
        e.disk.move(S.FILLING)
        path = self.disk.file_path(e.key)
        pieces = _runs(self.arena.view, e.blocks, self.block_bytes, e.nbytes)
        self.disk_io.submit(lambda: kvdisk.write_entry(path, e.header, pieces, e.nbytes, self.disk.mac_key,
                                                       self.disk.chunk, self.disk_files),
                            lambda r, err, s: self._spilled(e, err, s))

    def _spilled(self, e: Entry, err: BaseException | None, seconds: float) -> None:
        if err is None:
            e.disk.move(S.RESIDENT)
            e.arena.move(S.FREE)
            self.alloc.free(e.blocks)
            e.blocks = []
            self.metrics.spilled(e.kind)
            self.metrics.copied("ram_to_disk", e.nbytes, seconds)
        else:
            self._disk_failed(e, err)
            e.arena.move(S.RESIDENT)
        for w in self.room:
            w.spills.discard(e.key)
        self._settle(e)
        self._pump()

    # ----- copies out ------------------------------------------------------------

    def _restored(self, peer: bytes, msg: Restore, e: Entry, tier: str, err: BaseException | None,
                  seconds: float, skipped: int = 0) -> None:
        """A restore ended; ``skipped``: the payload bytes of the page items it did not copy."""
        slot = e.arena if tier == "ram" else e.disk
        slot.move(S.RESIDENT)
        if err is None:
            e.last_used = max(e.last_used, self.clock())
            copied = e.nbytes - skipped
            self.metrics.copied("ram_to_engine" if tier == "ram" else "disk_to_engine", copied, seconds)
            self.metrics.restored(tier, e.kind)
            self.reply(peer, Restored(msg.req, e.key, tier, copied))
            return self._settle(e)
        if isinstance(err, (kvdisk.CorruptFile, OSError)):
            reason = "corrupt" if isinstance(err, kvdisk.CorruptFile) else "io_error"
            log.error("restore of %s from KV-disk failed, entry dropped: %s", e.key, err)
            self.metrics.missing(reason)
            if isinstance(err, kvdisk.CorruptFile):
                self.metrics.check_failed(err.check)
            self.metrics.discarded("disk", e.kind)
            self._remove(e)
            return self.reply(peer, Missing(msg.req, e.key, reason, f"entry dropped: {err}"))
        log.error("restore of %s from %s failed: %s", e.key, tier, err)
        self._refuse(peer, msg, "copy_failed", f"copy out of {tier} failed: {err}")
        self._settle(e)

    # ----- state -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.copier.in_flight + (self.disk_io.in_flight if self.disk_io else 0)

    def counts(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for e in self.entries.values():
            if e.tier is not None:
                out[e.tier, e.kind] = out.get((e.tier, e.kind), 0) + 1
        return out

    def check(self) -> None:
        """Integrity: blocks and disk bytes each belong to exactly one entry; idle files match entries."""
        self.alloc.check()
        held = [b for e in self.entries.values() for b in e.blocks]
        if len(held) != len(set(held)) or len(held) != self.alloc.used_count:
            raise RuntimeError(f"arena blocks held by entries ({len(held)}) != allocated ({self.alloc.used_count})")
        if self.disk is not None:
            used = sum(e.file_bytes for e in self.entries.values() if e.disk.state is not S.FREE)
            if used != self.disk.used:
                raise RuntimeError(f"KV-disk bytes of entries ({used}) != accounted ({self.disk.used})")
            if not self.in_flight:
                on_disk = {e.key + kvdisk.SUFFIX for e in self.entries.values() if e.disk.holds_bytes}
                if set(self.disk.files()) != on_disk:
                    raise RuntimeError("KV-disk files do not match the entries held on disk")

    def rebind(self, memory: EngineMemory) -> int:
        """The engine restarted with new memory of the same layout: copies go to ``memory`` from now on, and
        every entry is dropped (live sequences died with the old process, and the new one finds retained
        entries only through records of their tokens, which died with it too); returns how many went.
        Only with no copy in flight (the server waits for them first)."""
        if self.in_flight or self.room:
            raise RuntimeError("rebind with copies in flight or demotes waiting for room")
        if memory.cuda_device != self.memory.cuda_device:
            raise ValueError("the restarted engine's memory is on another device")
        dropped = 0
        for e in list(self.entries.values()):
            if not e.busy:
                self.metrics.discarded(e.idle_in or "ram", e.kind)
                self._remove(e)
                dropped += 1
        self.memory.close()
        self.memory = memory
        return dropped

    def can_rebind(self, memory: EngineMemory) -> bool:
        return not self.in_flight and not self.room and memory.cuda_device == self.memory.cuda_device

    @property
    def copies_running(self) -> bool:
        """After ``close``: a copy abandoned by the server's wait still runs, and may still write into the
        arena or the KV-disk directory (neither is handed to a new session until it returns)."""
        return self.copier.running or (self.disk_io is not None and self.disk_io.running)

    def close(self) -> bool:
        """Drop every entry and stop the workers (the server waits for in-flight copies first). A copy
        still running keeps what it copies with open (the engine's mapped memory, the copy and disk
        threads): False, and ``close_resources`` once it has returned (``copies_running`` False)."""
        for e in list(self.entries.values()):
            if not e.busy:
                self._remove(e)
        self.copier.close()
        if self.disk_io is not None:
            self.disk_io.close()
        if self.copies_running:
            return False
        self.close_resources()
        return True

    def close_resources(self) -> None:
        """Close the copy backends, the disk threads and the engine's mapped memory (no copy runs; once)."""
        if self._resources_closed:
            return
        self._resources_closed = True
        if self.disk_io is not None:
            self.disk_files.close()
        self.backend.close()
        self.memory.close()


def _write_failure_reason(err: BaseException) -> str:
    """The ``disk_write_failures`` label of a failed KV-disk write."""
    if isinstance(err, OSError):
        return "disk_full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "io_error"
    return "other"


def _runs(view: np.ndarray, blocks: list[int], block_bytes: int, nbytes: int) -> list[np.ndarray]:
    """An entry's first ``nbytes`` in the arena as views, one per run of consecutive blocks."""
    out, i = [], 0
    while i < len(blocks):
        j = i + 1
        while j < len(blocks) and blocks[j] == blocks[j - 1] + 1:
            j += 1
        out.append(view[blocks[i] * block_bytes:(blocks[j - 1] + 1) * block_bytes])
        i = j
    excess = len(blocks) * block_bytes - nbytes
    if excess:
        out[-1] = out[-1][:out[-1].size - excess]
    return out


def _brief(shape: tuple[str, ...]) -> str:
    """('kv', 'kv', 'kv', 'ssm', 'conv') -> 'kv x3, ssm, conv'."""
    out, i = [], 0
    while i < len(shape):
        j = i
        while j < len(shape) and shape[j] == shape[i]:
            j += 1
        out.append(shape[i] if j - i == 1 else f"{shape[i]} x{j - i}")
        i = j
    return ", ".join(out)
