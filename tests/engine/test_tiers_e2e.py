"""Retained state demoted to tierd and restored: real tierd and engine processes, small pool and arena."""

from __future__ import annotations

import json

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ignis.shared.demo.tokenizer import TOKENIZER_SIZE
from tests.engine.engine_process import ROOT, EngineProcess


LOSS_FLAGS = ("--tierd-timeout", "3", "--tierd-retry-interval", "0.5")
"""For the tests where tierd is absent or killed: its loss is noticed after 3 s (the default 10 s is
only waited out) and the engine says hello again every half second. 3 s stays well above one
exchange with a live tierd here (a few hundred tokens), so none is lost while tierd runs."""


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(TOKENIZER_SIZE) for _ in range(n)]


class Tierd:
    def __init__(self, runtime_dir: Path, *flags: str):
        self.log = open(runtime_dir / "tierd.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "tierd", "--runtime-dir", str(runtime_dir),
                                      *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + 60
        self.endpoint = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"tierd exited: {(runtime_dir / 'tierd.log').read_text()[-3000:]}")
            if line.startswith("READY "):
                self.endpoint = line.split()[1]
                break

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(20)
        finally:
            self.log.close()


def fill_pool(eng: EngineProcess, tag: str, n: int = 3):
    """Unrelated long requests that need the pool's room, so retained entries must go."""
    for i in range(n):
        out = eng.run(f"{tag}-{i}", prompt(900, 1000 + i), max_tokens=2, ignore_eos=True)
        assert out.finished is not None, out


@pytest.mark.parametrize("tier,kv_format", [("kv_ram", "bf16"), ("kv_disk", "bf16"), ("kv_ram", "hq-e8-2b"),
                                            ("kv_disk", "hq-e8-2b")])
def test_retained_entries_demote_and_restore_bit_exact(tmp_path, tier, kv_format):
    rt = tmp_path / "rt"
    rt.mkdir()
    if tier == "kv_ram":
        tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    else:  # an arena too small for an entry: everything goes on to KV-disk
        tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64M")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--reuse-host-slots-per-lane", "4", "--restore-floor-kv-ram", "64",
                        "--restore-floor-kv-disk", "64", "--kv-format", kv_format)
    try:
        p = prompt(300, 1)
        first = eng.run("a1", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        assert first.finished.usage.cached_tokens == 0
        fill_pool(eng, "fill")
        stats = eng.stats()
        assert stats["reuse_demotions_total"] >= 1, (stats, eng.log_text())
        again = eng.run("a2", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        assert again.finished.usage.cached_tokens == 297, eng.log_text()
        assert again.finished.reuse.tier == tier
        assert again.tokens == first.tokens
        assert eng.stats()["reuse_restores_total"] >= 1
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0


def test_a_salted_entry_below_the_device_is_restored_only_under_its_salt(tmp_path):
    """tierd keys entries by their key tokens, which carry a request's cache salt: a KV-RAM entry made
    under one salt is no match for the same prompt under another salt or none (nothing is restored for
    them), and is restored bit-exact under its own."""
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--reuse-host-slots-per-lane", "4", "--restore-floor-kv-ram", "64")
    salt_a, salt_b = "a" * 64, "b" * 64
    try:
        p = prompt(300, 1)
        marks = dict(max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        first = eng.run("a1", p, cache_salt=salt_a, **marks)
        fill_pool(eng, "fill")
        assert eng.stats()["reuse_demotions_total"] >= 1, eng.log_text()
        for rid, salt in (("b", salt_b), ("plain", None)):
            other = eng.run(rid, p, cache_salt=salt, **marks)
            assert other.finished.usage.cached_tokens == 0, eng.log_text()
            assert other.tokens == first.tokens
        assert eng.stats()["reuse_restores_total"] == 0
        fill_pool(eng, "fill-again")  # the unsalted and salt-b entries made just now leave the device too
        again = eng.run("a2", p, cache_salt=salt_a, **marks)
        assert again.finished.usage.cached_tokens == 297, eng.log_text()
        assert again.finished.reuse.tier == "kv_ram"
        assert again.tokens == first.tokens
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0


def test_a_cache_reset_drops_entries_in_every_tier(tmp_path):
    """``FlushCache`` on an idle engine: the device entries and the KV-RAM ones are gone (tierd holds
    none after it: its gauge of entries reads 0), the next request is cold with the same output, and
    reuse goes on after it."""
    from tests.tierd.fake_engine import TierdProcess

    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--reuse-host-slots-per-lane", "4", "--restore-floor-kv-ram", "64")
    held = lambda: tierd.metric("ignis:tierd_entries", tier="ram", kind="retained")  # noqa: E731
    try:
        p = prompt(300, 1)
        marks = dict(max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        first = eng.run("a1", p, **marks)
        fill_pool(eng, "fill")
        stats = eng.stats()
        assert stats["reuse_demotions_total"] >= 1 and stats["retained_lower_entries"] >= 1, eng.log_text()
        assert held() == stats["retained_lower_entries"]
        answer = eng.flush_cache()
        assert answer.flushed and answer.entries == stats["retained_entries"] + stats["retained_lower_entries"]
        stats = eng.stats()
        assert stats["retained_entries"] == 0 and stats["retained_lower_entries"] == 0 and held() == 0, eng.log_text()
        assert stats["reuse_flushes_total"] == 1 and stats["pool_pages_free"] == stats["pool_pages_total"]
        cold = eng.run("a2", p, **marks)
        assert cold.finished.usage.cached_tokens == 0 and cold.tokens == first.tokens
        assert eng.stats()["reuse_restores_total"] == 0
        again = eng.run("a3", p, **marks)
        assert again.finished.usage.cached_tokens == 297 and again.tokens == first.tokens
        assert "prefix cache reset: " in eng.log_text()
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0


def test_engine_without_a_tierd_still_serves(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    eng = EngineProcess(rt, "--tierd-endpoint", f"ipc://{rt}/nobody.sock", "--kv-pool-tokens", "1024",
                        "--decode-lanes", "2", *LOSS_FLAGS)
    try:
        p = prompt(300, 2)
        eng.run("b1", p, max_tokens=3, opener_start=297)
        fill_pool(eng, "fill2")
        out = eng.run("b2", p, max_tokens=3, opener_start=297)
        assert out.finished.finish_reason == "length"
        assert out.finished.usage.cached_tokens == 0  # the entry was discarded: a miss, not an outage
    finally:
        assert eng.stop() == 0


def done_line(eng, rid: str) -> dict:
    """``rid``'s done line (written just after its answer goes out: waited for)."""
    deadline, done = time.monotonic() + 30, []
    while not done and time.monotonic() < deadline:
        done = [json.loads(line[line.index("{"):]) for line in eng.log_path.read_text().splitlines()
                if '"event":"done"' in line and f'"{rid}"' in line]
        time.sleep(0.05)
    assert len(done) == 1, done
    return done[0]


def _run_pair(eng, tag):
    p = prompt(300, 7)
    first = eng.run(f"{tag}-1", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
    fill_pool(eng, f"{tag}-fill")
    return p, first


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_damaged_disk_file_is_a_miss_with_correct_output(tmp_path, damage):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64M")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--restore-floor-kv-disk", "64")
    try:
        p, first = _run_pair(eng, damage)
        files = sorted((rt / "default-kv-disk").glob("*.kv"))
        assert files, list((rt / "default-kv-disk").iterdir())
        for f in files:
            data = f.read_bytes()
            if damage == "truncate":
                f.write_bytes(data[: len(data) // 2])
            else:
                f.write_bytes(data[:-100] + bytes(b ^ 0xFF for b in data[-100:]))
        again = eng.run(f"{damage}-2", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        assert again.finished.reuse.tier != "kv_disk"
        assert again.tokens == first.tokens
        # no silent fallback: the done line names the failed restore as the reason it reused less
        assert done_line(eng, f"{damage}-2")["shortfall"] == "tier_failed"
    finally:
        assert eng.stop() == 0
        tierd.stop()


def test_tierd_killed_requests_still_complete_correctly(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        *LOSS_FLAGS)
    try:
        p = prompt(300, 8)
        first = eng.run("k1", p, max_tokens=6, ignore_eos=True, opener_start=297)
        tierd.proc.kill()
        tierd.proc.wait()
        fill_pool(eng, "k-fill")  # demotions now go nowhere: the engine discards instead
        again = eng.run("k2", p, max_tokens=6, ignore_eos=True, opener_start=297)
        assert again.finished.finish_reason == "length"
        assert again.tokens == first.tokens
        # its checkpoint could not go down (tierd gone): the done line blames the tier, not an eviction
        assert done_line(eng, "k2")["shortfall"] == "tier_failed"
    finally:
        assert eng.stop() == 0
        tierd.log.close()


@pytest.mark.parametrize("during", ["demote", "restore"])
def test_tierd_killed_mid_copy_requests_still_complete_correctly(tmp_path, during):
    """Every copy pauses half way (tierd's fault-injection knob), so the kill lands with part of the
    bytes moved: a half-filled arena slot (demote) or half-written engine pages (restore)."""
    from tests.tierd.fake_engine import TierdProcess
    from ignis.tierd.copier import FAULT_PAUSE_ENV

    rt = tmp_path / "rt"
    rt.mkdir()
    pause = "60" if during == "demote" else "1.5"  # a restore needs a demote that finishes first
    # --tierd-timeout: how long the engine waits on the killed tierd; the paused demote before a restore
    # finishes well within it
    timeout = "4" if during == "demote" else "6"
    tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0",
                         env={FAULT_PAUSE_ENV: pause})
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--metrics-port", "0", "--tierd-timeout", timeout, "--tierd-retry-interval", "0.5")
    try:
        p = prompt(300, 8)
        first = eng.run("k1", p, max_tokens=6, ignore_eos=True, opener_start=297)
        if during == "restore":
            fill_pool(eng, "k-fill")  # the entry goes down whole (the pause is short)
            assert eng.stats()["reuse_demotions_total"] >= 1, eng.log_text()
            eng.generate("k2", p, max_tokens=6, ignore_eos=True, opener_start=297)
        else:
            for i in range(3):
                eng.generate(f"k-fill-{i}", prompt(900, 1000 + i), max_tokens=2, ignore_eos=True)
        deadline = time.monotonic() + 60
        while tierd.metric("ignis:tierd_copies_in_flight") < 1:
            assert time.monotonic() < deadline, tierd.log_text()
            eng.pump(0.05)
        time.sleep(0.2)  # the first half of the spans is copied by now; the copy sleeps in its middle
        tierd.proc.kill()
        tierd.proc.wait()
        if during == "restore":
            again = eng.wait(["k2"], timeout=120)["k2"]
        else:
            outs = eng.wait([f"k-fill-{i}" for i in range(3)], timeout=120)
            assert all(o.finished is not None and o.finished.finish_reason == "length" for o in outs.values())
            again = eng.run("k2", p, max_tokens=6, ignore_eos=True, opener_start=297)
        assert again.finished.finish_reason == "length"
        assert again.tokens == first.tokens
        assert eng.stats()["reuse_restores_total"] == 0  # nothing came back from the killed tierd
        # the request stopped waiting after tier_wait_limit_s (2 s); the client gives the copy up at its timeout
        deadline = time.monotonic() + 30
        while f"tierd did not answer {during.capitalize()}" not in eng.log_path.read_text():
            assert time.monotonic() < deadline, eng.log_text()
            eng.pump(0.05)
    finally:
        assert eng.stop() == 0
        tierd.stop()


def test_full_lower_tiers_cause_no_crash(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64K")  # room for nothing
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2")
    try:
        p, first = _run_pair(eng, "full")
        again = eng.run("full-2", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        assert again.tokens == first.tokens
        assert eng.stats()["reuse_demotions_total"] == 0
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0


@pytest.mark.parametrize("kv_format", ["bf16", "hq-e8-2b"])
def test_live_eviction_through_tierd_resumes_exactly(tmp_path, kv_format):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "32M")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "4096", "--decode-lanes", "4",
                        "--evict-window-pages", "1", "--kv-format", kv_format)
    sampling = [dict(max_tokens=40), dict(max_tokens=40, temperature=0.9, seed=3),
                dict(max_tokens=40), dict(max_tokens=40, temperature=1.0, top_k=40, seed=8)]
    try:
        alone = {}
        for i in range(4):
            alone[i] = eng.run(f"alone{i}", prompt(150 + 10 * i, 60 + i), ignore_eos=True, **sampling[i]).tokens
        for i in range(4):
            eng.generate(f"agent{i}", prompt(150 + 10 * i, 60 + i), ignore_eos=True, request_class="agent",
                         **sampling[i])
        deadline = time.monotonic() + 60
        while not all(eng.outcomes[f"agent{i}"].batches >= 3 for i in range(4)):
            assert time.monotonic() < deadline
            eng.pump()
        for j in range(2):
            eng.generate(f"user{j}", prompt(50, 90 + j), max_tokens=5, ignore_eos=True)
        outs = eng.wait([f"agent{i}" for i in range(4)] + ["user0", "user1"])
        stats = eng.stats()
        assert stats["live_evictions_total"] >= 1, (stats, eng.log_text())
        assert stats["live_resumes_total"] == stats["live_evictions_total"]
        for i in range(4):
            assert outs[f"agent{i}"].tokens == alone[i], i
        assert all(len(outs[f"user{j}"].tokens) == 5 for j in range(2))
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0


def test_tierd_lost_then_back_the_engine_recomputes_and_reconnects(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    endpoint = tierd.endpoint
    eng = EngineProcess(rt, "--tierd-endpoint", endpoint, "--kv-pool-tokens", "4096", "--decode-lanes", "1",
                        "--evict-window-pages", "1", "--metrics-port", "0", *LOSS_FLAGS)
    try:
        alone = eng.run("alone", prompt(150, 70), max_tokens=30, ignore_eos=True).tokens
        eng.generate("agent", prompt(150, 70), max_tokens=30, ignore_eos=True, request_class="agent")
        while eng.outcomes["agent"].batches < 3:
            eng.pump()
        eng.generate("user", prompt(40, 71), max_tokens=40, ignore_eos=True)
        deadline = time.monotonic() + 60
        while eng.stats()["live_evictions_total"] < 1:  # the agent now lives only in tierd
            assert time.monotonic() < deadline, eng.log_text()
            eng.pump(0.05)
        tierd.proc.kill()  # gone with the agent's state
        tierd.proc.wait()
        outs = eng.wait(["agent", "user"], timeout=120)
        assert outs["agent"].tokens == alone  # recomputed from its tokens: output unchanged
        assert eng.stats()["live_resumes_total"] == 0
        tierd2 = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
        assert tierd2.endpoint == endpoint
        try:
            deadline = time.monotonic() + 60
            i = 0
            while eng.stats()["reuse_demotions_total"] < 1:  # after the back-off the engine says hello again
                assert time.monotonic() < deadline, eng.log_text()
                p = prompt(300, 200 + i)
                eng.run(f"retain{i}", p, max_tokens=2, opener_start=297)
                fill_pool(eng, f"refill{i}", n=1)
                i += 1
                time.sleep(0.5)
            assert eng.log_path.read_text().count("tierd connected") >= 2
        finally:
            assert tierd2.stop() == 0
    finally:
        assert eng.stop() == 0
        tierd.log.close()
