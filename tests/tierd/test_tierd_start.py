"""Starting and stopping tierd: arena locking under a small RLIMIT_MEMLOCK, the KV-disk directory, SIGTERM."""

from __future__ import annotations

import os
import signal

from tests.tierd.fake_engine import TierdProcess, unlocked_memlock_preexec

LIMIT = 256 << 10  # RLIMIT_MEMLOCK for the child, far below the 4 MiB arena


def test_required_mlock_that_fails_exits_naming_the_fix(tmp_path):
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "4M", "--require-mlock", "on",
                        expect_ready=False, preexec_fn=unlocked_memlock_preexec(LIMIT))
    rc = proc.wait()
    proc.stop()
    log = proc.log_text()
    assert rc != 0
    assert "LimitMEMLOCK=infinity" in log and "ulimit -l" in log


def test_mlock_off_starts_and_reports_unlocked_bytes(tmp_path):
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "4M", "--require-mlock", "off",
                        preexec_fn=unlocked_memlock_preexec(LIMIT))
    try:
        locked = proc.metric("ignis:tierd_arena_locked_bytes")
        unlocked = proc.metric("ignis:tierd_arena_unlocked_bytes")
        assert 0 < locked <= LIMIT and unlocked == (4 << 20) - locked
        assert "ARENA NOT FULLY LOCKED" in proc.log_text()
    finally:
        assert proc.stop() == 0


def test_disk_dir_is_wiped_at_start_and_removed_at_exit(tmp_path):
    disk = tmp_path / "default-kv-disk"
    disk.mkdir()
    (disk / ".ignis-kv-disk").write_text("")
    (disk / f"{'ab' * 16}.kv").write_bytes(b"stale entry of a killed tierd")
    (disk / f"{'cd' * 16}.kv.part").write_bytes(b"half written")
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "1M")
    assert sorted(os.listdir(disk)) == [".ignis-kv-disk"]
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait() == 0
    proc.stop()
    assert not disk.exists()


def test_a_disk_dir_with_foreign_files_is_refused_and_left_alone(tmp_path):
    for name, marker in (("mine.txt", True), ("data.kv", False)):
        disk = tmp_path / f"kv-{name}"
        disk.mkdir()
        if marker:
            (disk / ".ignis-kv-disk").write_text("")
        (disk / name).write_text("precious")
        proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "1M",
                            "--kv-disk-dir", str(disk), expect_ready=False, metrics=False)
        assert proc.wait() != 0
        proc.stop()
        assert "refusing to wipe it" in proc.log_text()
        assert (disk / name).read_text() == "precious"


def test_explicit_zero_disk_never_touches_the_directory(tmp_path):
    disk = tmp_path / "default-kv-disk"
    disk.mkdir()
    (disk / "unrelated").write_text("x")
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "0", metrics=False)
    assert proc.stop() == 0
    assert (disk / "unrelated").read_text() == "x"


def test_bad_flags_exit_with_a_message(tmp_path):
    for flags, words in ((("--reuse-kv-host-pool-bytes", "lots"),
                          "--reuse-kv-host-pool-bytes: not a byte size: 'lots'"),
                         (("--reuse-retained-interactive-ttl", "-1"), "must be seconds >= 0")):
        proc = TierdProcess(tmp_path, *flags, expect_ready=False, metrics=False)
        assert proc.wait() != 0
        proc.stop()
        assert words in proc.log_text()


def test_kv_disk_without_the_cryptography_package_exits_naming_it(tmp_path):
    """KV-disk's MAC needs ``cryptography``: without it tierd refuses to start (exit 2) and says what to do;
    with KV-disk off it starts as before."""
    shadow = tmp_path / "shadow" / "cryptography"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("cryptography left out for this test")\n')
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(shadow.parent), os.environ.get("PYTHONPATH")) if p)}
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "1M",
                        expect_ready=False, metrics=False, env=env)
    assert proc.wait() == 2
    proc.stop()
    assert "pip install cryptography, or --kv-disk-bytes 0" in proc.log_text()
    off = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "0", metrics=False, env=env)
    assert off.stop() == 0


def test_a_kv_disk_directory_broken_after_start_costs_kv_disk_only_and_the_stop_still_exits_0(tmp_path):
    """The directory replaced by a file before an engine's hello: that session runs with KV-disk off (logged,
    counted) and KV-RAM serves; a stop whose wipe fails still exits 0."""
    from tests.tierd.fake_engine import FakeEngine
    from tests.tierd.test_tierd_process import demote, lookup, restore
    from ignis.shared.tier_wire import Restored, Welcome

    disk = tmp_path / "kv"
    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "1M", "--kv-disk-bytes", "1M",
                        "--kv-disk-dir", str(disk))
    os.rename(disk, tmp_path / "moved")
    disk.write_text("not a directory")
    eng = FakeEngine(proc.endpoint)
    try:
        welcome = eng.hello()
        assert isinstance(welcome, Welcome) and welcome.disk_bytes == 0
        demote(eng, 1)
        assert lookup(eng, 1) == ["ram"] and isinstance(restore(eng, 1), Restored)
        assert proc.metric("ignis:tierd_disk_write_failures_total", reason="io_error") >= 1
        assert "KV-disk is off for this engine's session" in proc.log_text()
    finally:
        eng.close()
    assert proc.stop() == 0
