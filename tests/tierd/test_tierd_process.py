"""A real ``ignis tierd`` process on an ipc socket, driven by a fake engine over shared memory.

Entries here are 2 KV pages + one lane (ssm + conv) = 3 arena blocks of 16 KiB.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import zmq

from ignis.shared.tier_wire import (
    TIER_PROTOCOL_VERSION,
    Bye,
    Demote,
    Demoted,
    Detached,
    Drop,
    Dropped,
    ErrorReply,
    Lookup,
    Missing,
    Restore,
    Restored,
    Stats,
    StatsReply,
    TierRefused,
    Welcome,
    decode,
)
from tests.tierd.fake_engine import STAMP, FakeEngine, TierdProcess, key

SRC = (("kv", 3), ("kv", 9), ("ssm", 1), ("conv", 1))
DST = (("kv", 20), ("kv", 21), ("ssm", 3), ("conv", 3))


@pytest.fixture(scope="module")
def tierd(tmp_path_factory):
    """Arena 1 MiB, KV-disk auto (4 GiB for qwen3_next, off for qwen3_5)."""
    proc = TierdProcess(tmp_path_factory.mktemp("rt"), "--reuse-kv-host-pool-bytes", "1M")
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def engine(tierd):
    eng = FakeEngine(tierd.endpoint)
    assert isinstance(eng.hello(), Welcome)
    yield eng
    eng.close()


def demote(eng: FakeEngine, n: int, src=SRC, **kw):
    """Demote fresh random bytes from ``src`` under key(n); returns (reply, the bytes demoted)."""
    eng.scramble()
    want = eng.read(src)
    kw.setdefault("last_used", time.time())
    return eng.ask(Demote(eng.next_req(), key(n), STAMP, tuple(src), **kw)), want


def restore(eng: FakeEngine, n: int, dst=DST, stamp=STAMP):
    eng.scramble()
    return eng.ask(Restore(eng.next_req(), key(n), stamp, tuple(dst)))


def lookup(eng: FakeEngine, *ns) -> list:
    reply = eng.ask(Lookup(eng.next_req(), STAMP, tuple(key(n) for n in ns)))
    return list(reply.tiers)


def stats(eng: FakeEngine) -> dict:
    eng.chan.send(Stats())
    while True:
        env = eng.chan.get(timeout=10)
        if isinstance(env.message, StatsReply):
            return env.message.values


def test_round_trip_is_bit_exact_into_other_pages_and_lane(engine):
    reply, want = demote(engine, 1, kind="live")
    assert reply == Demoted(reply.req, key(1), "ram", 2 * 16384 + 3 * 512 + 3 * 300)
    got = restore(engine, 1)
    assert isinstance(got, Restored) and got.tier == "ram"
    assert engine.read(DST) == want
    # restoring copies and never consumes: a second fork from the same point also hits
    assert isinstance(restore(engine, 1, dst=(("kv", 0), ("kv", 1), ("ssm", 0), ("conv", 0))), Restored)
    assert engine.read((("kv", 0), ("kv", 1), ("ssm", 0), ("conv", 0))) == want


def test_host_slot_image_and_direct_disk_round_trip(engine):
    src = (("kv", 4), ("host_slots", 0))
    reply, want = demote(engine, 2, src=src, target="disk")
    assert isinstance(reply, Demoted) and reply.tier == "disk"
    got = restore(engine, 2, dst=(("kv", 30), ("host_slots", 3)))
    assert isinstance(got, Restored) and got.tier == "disk"
    assert engine.read((("kv", 30), ("host_slots", 3))) == want
    assert lookup(engine, 2) == ["disk"]  # a restore keeps the file (lazy)


@pytest.mark.parametrize("target", ["ram", "disk"])
def test_a_restore_that_skips_its_first_pages_copies_only_the_rest(engine, target):
    """The engine shares the first pages from a device entry: tierd writes only the items after them,
    from the right place in the payload, and nothing else in engine memory."""
    src = (("kv", 5), ("kv", 6), ("kv", 7), ("host_slots", 1))
    reply, want = demote(engine, 20 if target == "ram" else 21, src=src, target=target)
    assert isinstance(reply, Demoted) and reply.tier == target
    page = len(engine.read((("kv", 0),)))
    dst = (("kv", 12), ("kv", 13), ("host_slots", 2))
    engine.scramble()
    others = tuple(("kv", i) for i in range(32) if i not in (12, 13)) + (("host_slots", 1), ("host_slots", 3))
    before = engine.read(others)
    got = engine.ask(Restore(engine.next_req(), reply.key, STAMP, dst, skip=1))
    assert isinstance(got, Restored) and got.tier == target
    assert got.nbytes == reply.nbytes - page  # what was copied
    assert engine.read(dst) == want[page:]
    assert engine.read(others) == before
    # every page may be skipped: the image alone comes back
    assert isinstance(engine.ask(Restore(engine.next_req(), reply.key, STAMP, (("host_slots", 3),), skip=3)),
                      Restored)
    assert engine.read((("host_slots", 3),)) == want[3 * page:]
    # what is left must be the rest of the source
    for skip, dest in ((2, dst), (1, (("kv", 12), ("host_slots", 2))), (0, dst)):
        bad = engine.ask(Restore(engine.next_req(), reply.key, STAMP, dest, skip=skip))
        assert isinstance(bad, TierRefused) and bad.reason == "bad_request", (skip, bad)


def test_restore_must_name_the_same_blocks(engine):
    demote(engine, 3)
    before = engine.snapshot()
    got = engine.ask(Restore(engine.next_req(), key(3), STAMP, (("kv", 1), ("host_slots", 0))))
    assert isinstance(got, TierRefused) and got.reason == "bad_request" and "same blocks" in got.message
    assert engine.snapshot() == before
    bad = engine.ask(Demote(engine.next_req(), key(4), STAMP, (("ssm", 0), ("kv", 1))))
    assert isinstance(bad, TierRefused) and bad.reason == "bad_request"
    out_of_range = engine.ask(Demote(engine.next_req(), key(4), STAMP, (("kv", 32),)))
    assert isinstance(out_of_range, TierRefused) and "items 0..31" in out_of_range.message


def test_stamp_mismatch_moves_no_bytes(engine):
    reply, want = demote(engine, 5)
    assert isinstance(reply, Demoted)
    before_stats, before_mem = stats(engine), engine.snapshot()
    other = "ffff/hq-e8-2b/drafter"
    got = engine.ask(Demote(engine.next_req(), key(6), other, SRC))
    assert isinstance(got, TierRefused) and got.reason == "stamp"
    got = engine.ask(Restore(engine.next_req(), key(5), other, DST))
    assert isinstance(got, TierRefused) and got.reason == "stamp"
    assert engine.snapshot() == before_mem
    after = stats(engine)
    assert after["arena_blocks_free"] == before_stats["arena_blocks_free"] and after["entries"] == 1
    assert lookup(engine, 5, 6) == ["ram", None]


def test_unknown_key_drop_and_lookup(engine):
    got = restore(engine, 99)
    assert isinstance(got, Missing) and got.reason == "unknown"
    demote(engine, 7)
    assert engine.ask(Drop(engine.next_req(), key(7))).held is True
    assert engine.ask(Drop(engine.next_req(), key(7))) == Dropped(engine._req, key(7), False)
    assert lookup(engine, 7) == [None]


def test_a_duplicate_demote_moves_nothing_and_keeps_the_entry(engine):
    reply, want = demote(engine, 8)
    again, _ = demote(engine, 8)
    assert isinstance(again, Demoted) and again.tier == "ram"
    assert stats(engine)["entries"] == 1
    restore(engine, 8)
    assert engine.read(DST) == want  # the first demote's bytes: same key, same content


def test_corrupt_or_truncated_disk_file_answers_missing_and_tierd_keeps_serving(engine, tierd):
    disk_dir = tierd.runtime_dir / "default-kv-disk"
    for n, damage in ((10, "flip"), (11, "truncate")):
        reply, _ = demote(engine, n, target="disk")
        assert reply.tier == "disk"
        path = disk_dir / f"{key(n)}.kv"
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
        else:
            data = data[:-100]
        path.write_bytes(bytes(data))
        engine.scramble()
        before = engine.snapshot()
        check = "checksum" if damage == "flip" else "size"
        failed = tierd.metric("ignis:tierd_checksum_failures_total", check=check)
        got = engine.ask(Restore(engine.next_req(), key(n), STAMP, DST))
        assert isinstance(got, Missing) and got.reason == "corrupt", got
        assert ("checksum" if damage == "flip" else "expected") in got.message
        assert engine.snapshot() == before  # a one-chunk entry never reaches engine memory when bad
        assert not path.exists() and lookup(engine, n) == [None]
        assert tierd.metric("ignis:tierd_checksum_failures_total", check=check) == failed + 1
    reply, want = demote(engine, 12, target="disk")
    assert isinstance(restore(engine, 12), Restored) and engine.read(DST) == want


def test_garbage_and_wrong_versions_get_clear_errors(engine, tierd):
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 10000)
    raw.connect(tierd.endpoint)
    try:
        for frames, words in (([b"\xff not json"], "not JSON"),
                              ([b'{"type": "tier_hello", "v": 2}'], "protocol version 2"),
                              ([b'{"type": "tier_demote", "v": 1, "req": 1}'], "missing field"),
                              ([b'{"type": "tier_demoted", "v": 1}'], "not accepted")):
            raw.send_multipart(frames)
            reply = decode(raw.recv_multipart())
            assert isinstance(reply, ErrorReply) and words in reply.message
    finally:
        raw.close()
    refused = engine.hello(protocol=99)
    assert isinstance(refused, TierRefused) and refused.reason == "protocol" and f"this tierd speaks {TIER_PROTOCOL_VERSION}" in \
        refused.message
    assert isinstance(engine.hello(), Welcome)  # and it still serves
    assert tierd.metric("ignis:tierd_wire_errors_total", socket="engine") >= 4


def test_requests_before_hello_and_from_a_stale_engine_are_refused(tierd):
    first = FakeEngine(tierd.endpoint, seed=1)
    try:
        got = first.ask(Demote(first.next_req(), key(1), STAMP, SRC))
        assert isinstance(got, TierRefused) and got.reason == "not_ready"
        first.hello()
        second = FakeEngine(tierd.endpoint, seed=2)
        try:
            assert isinstance(second.hello(), Welcome)
            got = first.ask(Restore(first.next_req(), key(1), STAMP, DST))
            assert isinstance(got, TierRefused) and got.reason == "not_ready"
        finally:
            second.close()
    finally:
        first.close()


def test_disk_auto_follows_the_family_and_a_new_hello_drops_everything(engine, tierd):
    demote(engine, 20)
    dense = engine.hello(family="qwen3_5")
    assert dense.disk_bytes == 0
    assert lookup(engine, 20) == [None] and stats(engine)["arena_blocks_free"] == dense.arena_blocks
    kv_dir = tierd.runtime_dir / "default-kv-disk"
    inode = kv_dir.stat().st_ino
    assert [p.name for p in kv_dir.iterdir()] == [".ignis-kv-disk"]  # wiped; kept (its lock is on it) until exit
    got = engine.ask(Demote(engine.next_req(), key(21), STAMP, SRC, target="disk"))
    assert isinstance(got, TierRefused) and got.reason == "no_disk"
    assert engine.hello(family="qwen3_next").disk_bytes == 4 << 30
    assert kv_dir.stat().st_ino == inode


def test_metrics_count_tiers_and_copies(engine, tierd):
    demote(engine, 30)
    restore(engine, 30)
    assert tierd.metric("ignis:tierd_arena_bytes") == 1 << 20
    assert tierd.metric("ignis:tierd_arena_unlocked_bytes") == 0
    assert tierd.metric("ignis:tierd_arena_used_bytes") == 3 * 16384
    assert tierd.metric("ignis:tierd_entries", tier="ram", kind="retained") == 1
    assert tierd.metric("ignis:tierd_demotions_total", tier="ram", kind="retained") >= 1
    assert tierd.metric("ignis:tierd_restores_total", tier="ram", kind="retained") >= 1
    assert tierd.metric("ignis:tierd_copy_bytes_total", direction="engine_to_ram") > 0
    assert tierd.metric("ignis:tierd_copy_gbps", direction="engine_to_ram") > 0
    assert tierd.metric("ignis:tierd_copy_gbps", direction="ram_to_engine") > 0
    assert tierd.metric("ignis:tierd_disk_ceiling_bytes") == 4 << 30


def test_a_hello_naming_another_engine_is_refused_and_changes_nothing(engine, tierd):
    reply, want = demote(engine, 40)
    assert isinstance(reply, Demoted)
    other = FakeEngine(tierd.endpoint, seed=3, engine_id="another-instance")
    try:
        refused = other.hello()
        assert isinstance(refused, TierRefused) and refused.reason == "busy"
        assert "'default'" in refused.message and "one engine" in refused.message
        assert tierd.metric("ignis:tierd_refusals_total", reason="busy") >= 1
    finally:
        other.close()
    assert isinstance(restore(engine, 40), Restored) and engine.read(DST) == want  # still served, entry intact


def test_a_bad_layout_hello_while_attached_changes_nothing(engine, tierd):
    reply, want = demote(engine, 41)
    again = FakeEngine(tierd.endpoint, seed=4)
    try:
        blocks = tuple(dataclasses.replace(b.descriptor(), handle="ignis-no-such-block")
                       for b in again.blocks.values())
        bad = again.hello(blocks=blocks)
        assert isinstance(bad, TierRefused) and bad.reason in ("bad_layout", "bad_request")
    finally:
        again.close()
    assert isinstance(restore(engine, 41), Restored) and engine.read(DST) == want


def test_the_same_engine_restarted_takes_over_with_its_entries_dropped(tierd):
    """A new engine process has no record of the old one's entries (their tokens), so none is kept for it."""
    first = FakeEngine(tierd.endpoint, seed=5)
    restarted = FakeEngine(tierd.endpoint, seed=6)
    try:
        assert isinstance(first.hello(), Welcome)
        _, want = demote(first, 42)
        _, _ = demote(first, 43, kind="live")
        first.chan.close()  # the engine died without a word
        first.attached = False
        assert isinstance(restarted.hello(), Welcome)
        assert lookup(restarted, 42, 43) == [None, None]
        _, again = demote(restarted, 44)  # the session goes on in the arena it kept
        assert isinstance(restore(restarted, 44), Restored) and restarted.read(DST) == again
    finally:
        restarted.close()
        for b in first.blocks.values():
            b.close()


def test_bye_drops_everything_and_frees_tierd_for_another_engine(tierd):
    first = FakeEngine(tierd.endpoint, seed=7)
    assert isinstance(first.hello(), Welcome)
    demote(first, 44)
    done = first.ask(Bye(first.next_req()))
    assert isinstance(done, Detached) and done.entries == 1
    first.attached = False
    first.close()
    other = FakeEngine(tierd.endpoint, seed=8, engine_id="another-instance")
    try:
        assert isinstance(other.hello(), Welcome)
        assert lookup(other, 44) == [None]
    finally:
        other.close()


def locked_kib(pid: int) -> int:
    """VmLck of a process: the memory it holds locked."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmLck:"):
            return int(line.split()[1])
    raise AssertionError("no VmLck line")


def test_bye_gives_the_arena_back_and_the_next_hello_takes_it_again(tmp_path):
    """Idle unload and model switch end in a Bye: tierd unlocks and unmaps its arena until the next hello."""
    tierd = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "1M", "--require-mlock", "on")
    try:
        first = FakeEngine(tierd.endpoint, seed=9)
        assert isinstance(first.hello(), Welcome)
        held = stats(first)
        assert held["arena_mapped_bytes"] == held["arena_locked_bytes"] == 1 << 20
        assert locked_kib(tierd.proc.pid) >= 1024
        demote(first, 45)
        assert isinstance(first.ask(Bye(first.next_req())), Detached)
        first.attached = False
        released = stats(first)
        assert (released["arena_bytes"], released["arena_mapped_bytes"], released["arena_locked_bytes"],
                released["arena_unlocked_bytes"]) == (1 << 20, 0, 0, 0)
        assert tierd.metric("ignis:tierd_arena_mapped_bytes") == 0
        assert tierd.metric("ignis:tierd_arena_locked_bytes") == 0
        assert locked_kib(tierd.proc.pid) < 1024
        first.close()

        second = FakeEngine(tierd.endpoint, seed=10)
        try:
            welcome = second.hello()
            assert isinstance(welcome, Welcome) and welcome.locked_bytes == 1 << 20
            assert stats(second)["arena_mapped_bytes"] == 1 << 20
            assert tierd.metric("ignis:tierd_arena_locked_bytes") == 1 << 20
            assert locked_kib(tierd.proc.pid) >= 1024
            reply, want = demote(second, 46)
            assert isinstance(reply, Demoted) and reply.tier == "ram"  # the new mapping holds bytes again
            assert isinstance(restore(second, 46), Restored) and second.read(DST) == want
        finally:
            second.close()
    finally:
        assert tierd.stop() == 0


def can_lock_past_the_limit() -> bool:
    """CAP_IPC_LOCK (root): mlock ignores RLIMIT_MEMLOCK."""
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 14 & 1)
    return False


@pytest.mark.skipif(can_lock_past_the_limit(), reason="CAP_IPC_LOCK: no memlock limit applies to mlock")
def test_a_hello_whose_arena_cannot_be_locked_again_is_refused_and_a_later_one_welcomed(tmp_path):
    import resource

    tierd = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "1M", "--require-mlock", "on")
    limit = resource.prlimit(tierd.proc.pid, resource.RLIMIT_MEMLOCK)
    try:
        first = FakeEngine(tierd.endpoint, seed=11)
        assert isinstance(first.hello(), Welcome)
        assert isinstance(first.ask(Bye(first.next_req())), Detached)
        first.attached = False
        resource.prlimit(tierd.proc.pid, resource.RLIMIT_MEMLOCK, (64 << 10, limit[1]))
        refused = first.hello()
        assert isinstance(refused, TierRefused) and refused.reason == "no_room"
        assert "LimitMEMLOCK" in refused.message
        assert stats(first)["arena_mapped_bytes"] == 0  # nothing half-taken
        resource.prlimit(tierd.proc.pid, resource.RLIMIT_MEMLOCK, limit)
        welcome = first.hello()  # the engine's next try
        assert isinstance(welcome, Welcome) and welcome.locked_bytes == 1 << 20
        first.close()
    finally:
        assert tierd.stop() == 0


def test_a_disk_file_forged_with_nan_bytes_and_plain_checksums_is_refused(engine, tierd):
    """The probe: someone rewrites a KV-disk file's payload with NaNs and recomputes unkeyed blake2b
    tags; the install's MAC refuses it before any byte reaches engine memory."""
    import hashlib
    import struct

    import numpy as np

    from ignis.tierd.disk_mac import NONCE_BYTES, TAG_BYTES

    disk_dir = tierd.runtime_dir / "default-kv-disk"
    key_file = tierd.runtime_dir / "default-kv-disk.key"
    assert key_file.stat().st_mode & 0o077 == 0 and len(key_file.read_bytes()) == 32
    reply, _ = demote(engine, 13, target="disk")
    path = disk_dir / f"{key(13)}.kv"
    data = bytearray(path.read_bytes())
    _, header_len, chunk = struct.unpack_from("<8sII", data)
    header = bytes(data[16:16 + header_len])
    payload_at, nbytes = 16 + header_len, reply.nbytes
    forged = np.full(nbytes // 4, np.nan, dtype=np.float32).tobytes().ljust(nbytes, b"\0")
    tags_at = payload_at + nbytes + NONCE_BYTES  # the file's own nonce stays
    tags = []
    for i in range(0, nbytes, chunk):
        d = hashlib.blake2b(bytes(data[payload_at + nbytes:tags_at]) + header, digest_size=TAG_BYTES)
        d.update((i // chunk).to_bytes(8, "little"))
        d.update(forged[i:i + chunk])
        tags.append(d.digest())
    data[payload_at:payload_at + nbytes] = forged
    data[tags_at:] = b"".join(tags)
    assert len(data) == path.stat().st_size  # the right size: only the MAC refuses it
    path.write_bytes(bytes(data))
    engine.scramble()
    before = engine.snapshot()
    got = engine.ask(Restore(engine.next_req(), key(13), STAMP, DST))
    assert isinstance(got, Missing) and got.reason == "corrupt" and "not written by this install" in got.message
    assert engine.snapshot() == before and lookup(engine, 13) == [None]
