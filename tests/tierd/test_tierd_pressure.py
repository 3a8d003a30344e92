"""Eviction under pressure in a real tierd: lazy spills, retained first, live work never discarded.

Arena: 8 blocks of 16 KiB. Every entry is 2 pages + a lane = 3 blocks, and
its KV-disk file ~35.4 KB; a 120 KiB ceiling holds three files, not four.
"""

from __future__ import annotations

import time

import pytest

from ignis.shared.tier_wire import Demoted, Drop, Restored, TierRefused
from tests.tierd.fake_engine import FakeEngine, TierdProcess, key
from tests.tierd.test_tierd_process import DST, SRC, demote, lookup, restore, stats


@pytest.fixture
def run(tmp_path):
    procs, engines = [], []

    def start(*flags):
        proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "128K", *flags)
        eng = FakeEngine(proc.endpoint)
        procs.append(proc)
        engines.append(eng)
        assert eng.hello().arena_blocks == 8
        return proc, eng

    yield start
    for eng in engines:
        eng.close()
    for proc in procs:
        assert proc.stop() == 0


def disk_files(proc) -> list[str]:
    d = proc.runtime_dir / "default-kv-disk"
    return sorted(p.name for p in d.glob("*.kv*"))


def test_disk_on_lazy_spills_retained_first_and_live_never_discarded(run):
    proc, eng = run("--kv-disk-bytes", "120K")
    t0 = time.time()
    want = {}

    def put(n, kind, cls, at):
        reply, want[n] = demote(eng, n, kind=kind, request_class=cls, last_used=t0 + at)
        return reply

    assert put(1, "retained", "interactive", 1).tier == "ram"
    assert put(2, "live", "agent", 2).tier == "ram"
    assert disk_files(proc) == []  # nothing goes down while the arena has room
    assert put(3, "live", "interactive", 3).tier == "ram"  # the retained entry makes way, to disk
    assert lookup(eng, 1, 2, 3) == ["disk", "ram", "ram"]
    assert put(4, "live", "interactive", 4).tier == "ram"  # the agent's live entry is next
    assert lookup(eng, 1, 2, 3, 4) == ["disk", "disk", "ram", "ram"]
    # a retained entry ranks below all the live work in the arena: it goes straight to disk
    assert put(5, "retained", "interactive", 5).tier == "disk"
    # live 3 spills; to fit its file, disk discards the oldest retained entry (1)
    assert put(6, "live", "interactive", 6).tier == "ram"
    assert lookup(eng, 1, 2, 3, 5) == [None, "disk", "disk", "disk"]
    assert put(7, "live", "interactive", 7).tier == "ram"  # live 4 spills, retained 5 is discarded
    assert lookup(eng, 2, 3, 4, 5, 6, 7) == ["disk", "disk", "disk", None, "ram", "ram"]
    # every tier is full of live work now: a live demote is refused, nothing is discarded
    got = put(8, "live", "interactive", 8)
    assert isinstance(got, TierRefused) and got.reason == "no_room"
    got = put(9, "retained", "interactive", 9)
    assert isinstance(got, TierRefused) and got.reason == "no_room"
    assert lookup(eng, 2, 3, 4, 6, 7, 8, 9) == ["disk", "disk", "disk", "ram", "ram", None, None]
    for n in (2, 3, 4, 6, 7):
        got = restore(eng, n)
        assert isinstance(got, Restored), got
        assert eng.read(DST) == want[n], f"entry {n} came back different"
    assert lookup(eng, 2) == ["disk"] and f"{key(2)}.kv" in disk_files(proc)  # kept after a restore
    assert proc.metric("ignis:tierd_discards_total", tier="disk", kind="retained") == 2
    assert proc.metric("ignis:tierd_discards_total", tier="disk", kind="live") == 0
    assert proc.metric("ignis:tierd_spills_total", kind="live") == 3
    assert proc.metric("ignis:tierd_refusals_total", reason="no_room") == 2
    # dropping everything leaves every block free and the directory empty (DESIGN §9, invariant 1)
    for n in (2, 3, 4, 6, 7):
        assert eng.ask(Drop(eng.next_req(), key(n))).held
    s = stats(eng)
    assert s["arena_blocks_free"] == 8 and s["disk_used_bytes"] == 0 and s["entries"] == 0
    assert disk_files(proc) == []
    assert proc.metric("ignis:tierd_entries", tier="disk", kind="live") == 0


def test_disk_off_discards_retained_first_and_never_a_live_entry(run):
    proc, eng = run("--kv-disk-bytes", "0")
    now = time.time()
    # an interactive checkpoint idle past the TTL (300 s) ranks as an agent's, and it is older
    assert demote(eng, 1, kind="retained", request_class="interactive", last_used=now - 1000)[0].tier == "ram"
    assert demote(eng, 2, kind="retained", request_class="agent", last_used=now)[0].tier == "ram"
    assert demote(eng, 3, kind="live", request_class="agent", last_used=now)[0].tier == "ram"
    assert lookup(eng, 1, 2, 3) == [None, "ram", "ram"]
    assert demote(eng, 4, kind="live", request_class="agent", last_used=now + 1)[0].tier == "ram"
    assert lookup(eng, 2, 3, 4) == [None, "ram", "ram"]
    for n, kind in ((5, "live"), (6, "retained")):
        got = demote(eng, n, kind=kind)[0]
        assert isinstance(got, TierRefused) and got.reason == "no_room" and "KV-disk off" in got.message
    got = demote(eng, 7, target="disk")[0]
    assert isinstance(got, TierRefused) and got.reason == "no_disk"
    assert lookup(eng, 3, 4) == ["ram", "ram"]
    assert proc.metric("ignis:tierd_discards_total", tier="ram", kind="retained") == 2
    assert proc.metric("ignis:tierd_disk_ceiling_bytes") == 0
    assert not (proc.runtime_dir / "default-kv-disk").exists()


def test_an_entry_larger_than_the_arena_goes_to_disk_or_is_refused(run):
    proc, eng = run("--kv-disk-bytes", "1M")
    big = tuple(("kv", i) for i in range(9))  # 9 blocks > 8
    reply, want = demote(eng, 1, src=big)
    assert isinstance(reply, Demoted) and reply.tier == "disk"
    got = restore(eng, 1, dst=tuple(("kv", 10 + i) for i in range(9)))
    assert isinstance(got, Restored) and eng.read(tuple(("kv", 10 + i) for i in range(9))) == want
    got = demote(eng, 2, src=big, target="ram")[0]
    assert isinstance(got, TierRefused) and got.reason == "no_room"
    assert demote(eng, 3, src=SRC, target="ram")[0].tier == "ram"
