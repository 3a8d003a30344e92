"""Fault: the disk fills during a KV-disk write (ENOSPC, injected by ``IGNIS_TIERD_FAULT_DISK_FULL=1``).

What must hold: the entry is dropped (a demote to disk is refused, a spill's
victim stays in KV-RAM or is discarded), the partial ``.part`` file is gone
(nothing but the marker is left in the KV-disk directory), KV-disk takes no
writes for its retry delay while KV-RAM keeps serving, and
``ignis:tierd_disk_write_failures_total{reason="disk_full"}`` counts it. With
a real engine, the request whose entry was lost is recomputed with the same
greedy tokens as its cold run.

Already covered elsewhere: a failed spill turning KV-disk off and the retry
after the delay (tests/tierd/test_store.py), a failed write leaving no file
(tests/tierd/test_disk.py::test_a_failed_write_leaves_no_file).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ignis.shared.tier_wire import Demote, Demoted, Restore, Restored, TierRefused
from ignis.tierd.disk import FAULT_DISK_FULL_ENV, MARKER, encode_header, write_entry
from tests.engine.engine_process import EngineProcess
from tests.engine.test_tiers_e2e import fill_pool, prompt
from tests.tierd.fake_engine import STAMP, TierdProcess, key
from tests.tierd.test_metrics import samples
from tests.tierd.test_store import DST, SRC, Harness

DISK_FULL = (("instance", "t"), ("reason", "disk_full"))


@pytest.fixture
def disk_full(monkeypatch):
    monkeypatch.setenv(FAULT_DISK_FULL_ENV, "1")


def test_the_injected_enospc_leaves_a_partial_file_that_write_entry_removes(tmp_path, disk_full, monkeypatch):
    """The fault fires after the payload is on disk, so there is a partial file to clean up."""
    import ignis.tierd.disk as kvdisk

    seen = []
    real = kvdisk.fault_disk_full

    def spy() -> bool:
        seen.append(sorted(os.listdir(tmp_path)))
        return real()

    monkeypatch.setattr(kvdisk, "fault_disk_full", spy)
    payload = np.arange(20000, dtype=np.uint8)
    header = encode_header(key(1), STAMP, payload.nbytes, ("kv",))
    with pytest.raises(OSError) as e:
        write_entry(tmp_path / f"{key(1)}.kv", header, [payload], payload.nbytes, bytes(32), 4096)
    assert e.value.errno == 28  # ENOSPC
    assert seen == [[f"{key(1)}.kv.part"]]  # the partial file existed when the disk "filled"
    assert os.listdir(tmp_path) == []


def test_a_demote_to_a_full_disk_is_refused_cleaned_up_and_counted_and_ram_serves_on(tmp_path, disk_full):
    h = Harness(tmp_path, arena_blocks=3, disk_bytes=1 << 20)
    try:
        h.send(Demote, key(1), STAMP, SRC, target="disk")
        [reply] = h.settle()  # settle() runs the store's integrity check too
        assert isinstance(reply, TierRefused) and reply.reason == "copy_failed" and "No space" in reply.message
        assert os.listdir(tmp_path / "kv") == [MARKER] and h.store.disk.used == 0
        assert key(1) not in h.store.entries and not h.store.disk.healthy
        assert samples(h.store.metrics)[("ignis:tierd_disk_write_failures_total", DISK_FULL)] == 1
        want = h.read(SRC)
        h.send(Demote, key(2), STAMP, SRC)  # KV-RAM is unaffected
        h.send(Restore, key(2), STAMP, DST)
        assert [type(m) for m in h.settle()] == [Demoted, Restored] and h.read(DST) == want
    finally:
        h.close()


def test_a_spill_to_a_full_disk_is_cleaned_up_counted_and_the_live_demote_still_lands(tmp_path, disk_full):
    h = Harness(tmp_path, arena_blocks=3, disk_bytes=1 << 20)
    try:
        h.send(Demote, key(1), STAMP, SRC, kind="retained", last_used=1.0)
        h.settle()
        h.send(Demote, key(2), STAMP, SRC, kind="live", last_used=2.0)  # needs key(1)'s blocks: a spill
        [reply] = h.settle()
        assert isinstance(reply, Demoted) and reply.tier == "ram"
        assert os.listdir(tmp_path / "kv") == [MARKER]
        assert samples(h.store.metrics)[("ignis:tierd_disk_write_failures_total", DISK_FULL)] == 1
    finally:
        h.close()


def test_disk_full_under_a_real_engine_the_request_is_recomputed_equal_to_cold(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    # an arena too small for an entry: every demote is a KV-disk write, and every one hits a full disk
    tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64M",
                         env={FAULT_DISK_FULL_ENV: "1"})
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--restore-floor-kv-disk", "64")
    try:
        p = prompt(300, 23)
        cold = eng.run("full-1", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        fill_pool(eng, "full-fill")
        assert tierd.metric("ignis:tierd_disk_write_failures_total", reason="disk_full") >= 1, tierd.log_text()
        assert sorted(os.listdir(rt / "default-kv-disk")) == [MARKER]
        again = eng.run("full-2", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        assert again.finished.finish_reason == "length" and again.finished.reuse.tier != "kv_disk"
        assert again.tokens == cold.tokens
        assert eng.stats()["reuse_demotions_total"] == 0
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0
