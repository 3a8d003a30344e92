"""TierStore in-process, with real copy threads: requests on busy keys, failed spills and failed copies.

The loop is this test: posted callbacks run when ``settle`` is called, so a
request can be made to arrive while a copy is still in flight.
"""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from ignis.shared.tier_wire import (Demote, Demoted, Drop, Dropped, Lookup, Missing, Restore, Restored, TierRefused,
                                    UnitLayout)
from tests.tierd.fake_engine import PAGE_BYTES, STAMP, key, make_blocks
from ignis.tierd.arena import Arena
from ignis.shared.process_lock import LockBusy, hold_directory_itself
from ignis.tierd.disk import DiskTier, prepare_dir
from ignis.tierd.memory_map import EngineMemory
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.store import TierStore

SRC = (("kv", 1), ("kv", 2), ("ssm", 0), ("conv", 0))
DST = (("kv", 5), ("kv", 6), ("ssm", 1), ("conv", 1))


class Harness:
    def __init__(self, tmp_path, arena_blocks: int, disk_bytes: int):
        self.blocks = make_blocks()
        for i, b in enumerate(self.blocks.values()):
            b.array()[...] = np.random.default_rng(i).integers(0, 256, b.array().shape, dtype=np.uint8)
        self.posted: queue.Queue = queue.Queue()
        self.replies: list = []
        self.memory = EngineMemory(tuple(b.descriptor() for b in self.blocks.values()), UnitLayout())
        disk = DiskTier(prepare_dir(tmp_path / "kv"), disk_bytes, bytes(32)) if disk_bytes else None
        self.store = TierStore(arena=Arena(arena_blocks * PAGE_BYTES), block_bytes=PAGE_BYTES, memory=self.memory,
                               disk=disk, stamp=STAMP, ttl=300.0, metrics=TierdMetrics("t"), post=self.posted.put,
                               reply=lambda peer, m: self.replies.append(m), again=self.handle)
        self.req = 0

    def handle(self, peer, msg) -> None:
        if isinstance(msg, Demote):
            self.store.demote(peer, msg, self.memory.resolve(msg.source))
        elif isinstance(msg, Restore):
            self.store.restore(peer, msg, self.memory.resolve(msg.dest))
        else:
            self.store.drop(peer, msg)

    def send(self, cls, *args, **kw):
        self.req += 1
        self.handle(b"peer", cls(self.req, *args, **kw))
        return self.req

    def settle(self) -> list:
        while self.store.in_flight or not self.posted.empty():
            self.posted.get(timeout=5)()
        out, self.replies = self.replies, []
        self.store.check()
        return out

    def read(self, refs) -> bytes:
        return b"".join(self.blocks[b].item(i).tobytes() for b, i in refs)

    def close(self):
        self.store.close()
        for b in self.blocks.values():
            b.close()


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path, arena_blocks=3, disk_bytes=1 << 20)
    yield harness
    harness.close()


def test_requests_on_a_key_in_flight_wait_and_are_answered_in_order(h):
    want = h.read(SRC)
    d = h.send(Demote, key(1), STAMP, SRC, kind="live", last_used=time.time())
    r = h.send(Restore, key(1), STAMP, DST)  # the fill has not been posted back yet
    again = h.send(Demote, key(1), STAMP, SRC)
    x = h.send(Drop, key(1))
    assert [type(m) for m in h.settle()] == [Demoted, Restored, Demoted, Dropped]
    assert h.read(DST) == want
    assert h.store.entries == {} and h.store.alloc.free_count == 3
    assert (d, r, again, x) == (1, 2, 3, 4)


def test_a_failed_spill_turns_disk_off_and_the_victim_stays_in_ram_or_goes(h, tmp_path):
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
    h.settle()
    (tmp_path / "kv" / ".ignis-kv-disk").unlink()
    (tmp_path / "kv").rmdir()  # the spill's write fails
    h.send(Demote, key(2), STAMP, SRC, kind="live", last_used=2.0)
    replies = h.settle()
    assert [type(m) for m in replies] == [Demoted] and replies[0].tier == "ram"
    assert not h.store.disk.healthy and key(1) not in h.store.entries  # discarded once disk was gone
    # counted as a discard, and as one that KV-disk would have taken
    sample = h.store.metrics.registry.get_sample_value
    assert sample("ignis:tierd_discards_total", {"instance": "t", "tier": "ram", "kind": "retained"}) == 1
    assert sample("ignis:tierd_discards_disk_down_total", {"instance": "t", "kind": "retained"}) == 1
    got = h.send(Demote, key(3), STAMP, SRC, kind="live", last_used=3.0)
    assert [(type(m), m.reason) for m in h.settle()] == [(TierRefused, "no_room")] and got == 3



def test_kv_disk_takes_writes_again_after_the_retry_delay(h, tmp_path):
    from ignis.tierd.disk import prepare_dir

    now = [100.0]
    h.store.disk._clock = lambda: now[0]  # the tier's own clock, moved by hand
    h.store.disk.retry_after_s = 30.0
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
    h.settle()
    (tmp_path / "kv" / ".ignis-kv-disk").unlink()
    (tmp_path / "kv").rmdir()  # disk "full": the spill's write fails
    h.send(Demote, key(2), STAMP, SRC, kind="live", last_used=2.0)
    h.settle()
    assert not h.store.disk.healthy and h.store.disk.failures == 1
    prepare_dir(tmp_path / "kv")  # room again
    now[0] += 29.0
    assert not h.store.disk.healthy
    now[0] += 1.0
    assert h.store.disk.healthy
    h.send(Demote, key(3), STAMP, (("kv", 9), ("kv", 10), ("ssm", 2), ("conv", 2)), kind="live", last_used=3.0)
    assert [type(m) for m in h.settle()] == [Demoted]
    assert h.store.entries[key(2)].tier == "disk"  # the older live entry spilled to make room
    assert (tmp_path / "kv" / f"{key(2)}.kv").exists()


def test_a_failed_copy_is_refused_and_frees_its_blocks(h, monkeypatch):
    def broken(spans, host):
        raise RuntimeError("device lost")

    monkeypatch.setattr(h.store.backend, "gather", broken)
    h.send(Demote, key(1), STAMP, SRC)
    (reply,) = h.settle()
    assert isinstance(reply, TierRefused) and reply.reason == "copy_failed" and "device lost" in reply.message
    assert h.store.alloc.free_count == 3 and h.store.entries == {}


def test_a_restore_waits_for_its_entry_to_finish_spilling(h):
    want = h.read(SRC)
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
    h.settle()
    h.send(Demote, key(2), STAMP, (("kv", 9), ("kv", 10), ("ssm", 2), ("conv", 2)), kind="live", last_used=2.0)
    assert h.store.entries[key(1)].arena.state.name == "SPILLING"
    h.send(Restore, key(1), STAMP, DST)
    replies = h.settle()  # the fill and the disk read run on different threads: either may finish first
    assert sorted((type(m).__name__, m.tier) for m in replies) == [("Demoted", "ram"), ("Restored", "disk")]
    assert h.read(DST) == want


def _on_disk(h, n: int) -> None:
    """Entries 1..n demoted; the arena holds 3 blocks, so the older ones spill to KV-disk."""
    for i in range(1, n + 1):
        h.send(Demote, key(i), STAMP, SRC, kind="retained", last_used=float(i))
        h.settle()
    assert h.store.entries[key(1)].tier == "disk"


def test_a_kv_disk_directory_replaced_by_a_file_fails_restores_at_once_and_keeps_ram(h, tmp_path):
    """A file that cannot be read or deleted (the directory replaced, made read-only or immutable) is an
    answered miss, never a stall: the entry is forgotten, and KV-RAM serves on."""
    _on_disk(h, 2)
    (tmp_path / "kv").rename(tmp_path / "moved")
    (tmp_path / "kv").write_text("not a directory")
    h.send(Restore, key(1), STAMP, DST)
    (reply,) = h.settle()
    assert isinstance(reply, Missing) and reply.reason == "io_error"
    assert key(1) not in h.store.entries and not h.store.disk.healthy
    h.send(Restore, key(2), STAMP, DST)
    assert [type(m) for m in h.settle()] == [Restored]
    h.store.close()  # a stop with the directory still broken goes through
    h.store.close = lambda: None


def test_a_kv_disk_directory_removed_while_serving_is_made_again(h, tmp_path):
    now = [100.0]
    h.store.disk._clock = lambda: now[0]
    _on_disk(h, 2)
    used = h.store.disk.used
    assert used > 0
    for f in (tmp_path / "kv").iterdir():
        f.unlink()
    (tmp_path / "kv").rmdir()
    h.send(Demote, key(3), STAMP, (("kv", 9), ("kv", 10), ("ssm", 2), ("conv", 2)), kind="retained",
           last_used=3.0)  # room for it spills key 2, whose write fails: the directory is gone
    h.settle()
    assert (tmp_path / "kv" / ".ignis-kv-disk").exists()  # made again, with its marker
    with pytest.raises(LockBusy):  # and locked again: another path to the new directory is refused
        hold_directory_itself(tmp_path / "kv", "the KV-disk directory", wait_s=0)
    assert key(1) not in h.store.entries and h.store.disk.used == 0  # the vanished file's entry is forgotten
    now[0] += h.store.disk.retry_after_s
    h.send(Demote, key(4), STAMP, (("kv", 11), ("kv", 12), ("ssm", 3), ("conv", 3)), kind="retained",
           last_used=4.0)
    assert [type(m) for m in h.settle()] == [Demoted]
    assert any(e.tier == "disk" for e in h.store.entries.values())  # KV-disk takes writes again


def test_a_file_another_tierd_wrote_under_the_same_name_is_not_restored(tmp_path):
    """Two tierds on one KV-disk directory (a bind mount of it, with one install key: the lock beside each
    path differs) write the same file names for the same content key and stamp. The file the second one
    wrote over the first's is refused by the first's header check (each session's id is in its headers):
    a miss, never the other model's bytes."""
    a = Harness(tmp_path, arena_blocks=3, disk_bytes=1 << 20)
    try:
        _on_disk(a, 4)
        b = Harness(tmp_path, arena_blocks=3, disk_bytes=1 << 20)  # wipes the directory, as a tierd start does
        try:
            for block in b.blocks.values():
                block.array()[...] ^= 0xFF  # another model's state under the same key
            _on_disk(b, 4)
            assert (tmp_path / "kv" / f"{key(1)}.kv").exists()
            assert a.store.disk.session != b.store.disk.session
            a.send(Restore, key(1), STAMP, DST)
            (reply,) = a.settle()
            assert isinstance(reply, Missing) and reply.reason == "corrupt", reply
            assert a.read(DST) != b.read(SRC)
        finally:
            b.close()
    finally:
        a.close()


def test_room_for_the_demotes_before_a_restore_is_not_taken_from_the_entry_looked_up(tmp_path):
    """The engine looks keys up (longest first), then demotes device entries to free the pages its restore
    needs: the room those demotes take comes from the entry ranked lowest after the lookup, not the one
    about to be restored (it was the least recently used before it was looked up), and the shorter keys
    looked up with it are not ranked as used."""
    h = Harness(tmp_path, arena_blocks=6, disk_bytes=1 << 20)  # two entries in KV-RAM
    try:
        for i in (1, 2):
            h.send(Demote, key(i), STAMP, SRC, kind="retained", last_used=float(i))
            h.settle()
        # longest first: key 1 is the one a restore would take; key 2 (say, an earlier checkpoint of the same
        # conversation) keeps its rank, and so is the one room is made from
        reply = h.store.lookup(Lookup(99, STAMP, (key(7), key(1), key(2))))
        assert reply.tiers == (None, "ram", "ram")
        h.send(Demote, key(3), STAMP, (("kv", 9), ("kv", 10), ("ssm", 2), ("conv", 2)), kind="retained",
               last_used=3.0)
        h.settle()
        assert {k: h.store.entries[key(k)].tier for k in (1, 2, 3)} == {1: "ram", 2: "disk", 3: "ram"}
    finally:
        h.close()


def test_an_entry_larger_than_a_whole_tier_is_refused_as_such_and_logged_once(tmp_path, caplog):
    ram_only = Harness(tmp_path / "a", arena_blocks=1, disk_bytes=0)
    disk_small = Harness(tmp_path / "b", arena_blocks=1, disk_bytes=4096)
    try:
        with caplog.at_level("WARNING", logger="ignis.tierd"):
            for h, tier, target in ((ram_only, "KV-RAM", "auto"), (ram_only, "KV-RAM", "auto"),
                                    (disk_small, "KV-disk", "disk"), (disk_small, "KV-disk", "auto")):
                h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0, target=target)
                (reply,) = h.settle()
                assert isinstance(reply, TierRefused) and reply.reason == "no_room"
                assert f"larger than the whole {tier}" in reply.message, reply.message
        assert caplog.text.count("larger than the whole KV-RAM") == 1
        assert caplog.text.count("larger than the whole KV-disk") == 1
    finally:
        ram_only.close()
        disk_small.close()



OTHER = (("kv", 9), ("kv", 10), ("ssm", 2), ("conv", 2))


def test_a_key_demoted_again_while_on_kv_disk_comes_back_into_free_kv_ram(h, tmp_path):
    """The engine restored an entry from KV-disk and lets go of its copy again while the arena has room
    (the entry that pushed it down is gone): tierd fills the arena from that copy and deletes the file, so
    the next restore reads KV-RAM; a restore asked meanwhile waits for the fill."""
    want = h.read(SRC)
    _on_disk(h, 2)  # key 1 spilled by key 2
    h.send(Drop, key(2))
    h.settle()
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=3.0)
    assert h.store.entries[key(1)].busy  # neither restored nor discarded while it comes up
    h.send(Restore, key(1), STAMP, DST)
    replies = h.settle()
    assert [(type(m).__name__, m.tier) for m in replies] == [("Demoted", "ram"), ("Restored", "ram")]
    assert h.read(DST) == want
    assert h.store.entries[key(1)].tier == "ram" and not (tmp_path / "kv" / f"{key(1)}.kv").exists()
    assert h.store.metrics._promotions.labels("t", "retained")._value.get() == 1
    assert h.store.metrics._demotions.labels("t", "ram", "retained")._value.get() == 2  # keys 1, 2: not again


def test_a_key_on_kv_disk_stays_there_rather_than_push_another_entry_down(h, tmp_path):
    """However the two rank, a promotion takes free room only: over a working set larger than the arena,
    each entry coming up would push out the next one to be read."""
    _on_disk(h, 2)
    h.send(Demote, key(1), STAMP, SRC, kind="live", last_used=9.0)  # ranks above key 2 now
    assert [(type(m).__name__, m.tier) for m in h.settle()] == [("Demoted", "disk")]
    assert h.store.entries[key(2)].tier == "ram" and (tmp_path / "kv" / f"{key(1)}.kv").exists()
    h.send(Drop, key(2))
    h.settle()
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=10.0, target="disk")
    assert [(type(m).__name__, m.tier) for m in h.settle()] == [("Demoted", "disk")]  # asked for disk: stays


def test_a_failed_fill_back_into_kv_ram_leaves_the_entry_on_kv_disk(h, tmp_path, monkeypatch):
    want = h.read(SRC)
    _on_disk(h, 2)
    h.send(Drop, key(2))
    h.settle()

    def broken(spans, host):
        raise RuntimeError("device lost")

    monkeypatch.setattr(h.store.backend, "gather", broken)
    h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=3.0)
    assert [(type(m).__name__, m.tier) for m in h.settle()] == [("Demoted", "disk")]
    assert h.store.entries[key(1)].tier == "disk" and h.store.alloc.free_count == 3
    h.send(Restore, key(1), STAMP, DST)
    assert [(type(m).__name__, m.tier) for m in h.settle()] == [("Restored", "disk")]
    assert h.read(DST) == want


def test_with_kv_ram_off_a_demote_is_refused_as_such_and_nothing_is_logged(tmp_path, caplog):
    h = Harness(tmp_path, arena_blocks=0, disk_bytes=0)
    try:
        with caplog.at_level("WARNING", logger="ignis.tierd"):
            h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
            (reply,) = h.settle()
        assert isinstance(reply, TierRefused) and reply.reason == "no_room"
        assert reply.message == "KV-RAM is off (--reuse-kv-host-pool-bytes 0)"
        assert "larger than the whole" not in caplog.text
    finally:
        h.close()


def test_kv_ram_smaller_than_one_block_is_refused_as_too_small_not_as_off(tmp_path, caplog):
    h = Harness(tmp_path, arena_blocks=0, disk_bytes=0)
    h.store.copier.close()  # the harness's store goes; its engine memory serves the one made here
    h.store = TierStore(arena=Arena(PAGE_BYTES // 2), block_bytes=PAGE_BYTES, memory=h.memory, disk=None,
                        stamp=STAMP, ttl=300.0, metrics=TierdMetrics("t"), post=h.posted.put,
                        reply=lambda peer, m: h.replies.append(m), again=h.handle)
    try:
        with caplog.at_level("WARNING", logger="ignis.tierd"):
            h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
            (reply,) = h.settle()
        assert isinstance(reply, TierRefused) and "larger than the whole KV-RAM" in reply.message
        assert "raise --reuse-kv-host-pool-bytes" in caplog.text
    finally:
        h.close()
