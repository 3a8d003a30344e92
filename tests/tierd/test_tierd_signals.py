"""tierd stops on SIGTERM however the signals arrive: a burst of them must not wedge it.

A handler that takes a lock (``threading.Event.set``) deadlocks when a second
signal interrupts it, or when it interrupts a wait holding that lock; the
process then ignores SIGTERM for good.
"""

from __future__ import annotations

from tests.signal_burst import EXITED_ON_SIGTERM, sigterm_burst
from tests.tierd.fake_engine import TierdProcess


def test_a_burst_of_sigterms_stops_tierd(tmp_path):
    for _ in range(3):
        proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", metrics=False)
        try:
            sigterm_burst(proc.proc.pid)
            assert proc.wait(15) in EXITED_ON_SIGTERM, proc.log_text()
        finally:
            proc.stop()


def test_a_hangup_stops_tierd_cleanly(tmp_path):
    """A closed terminal's SIGHUP: tierd exits 0 and takes its socket and KV-disk directory with it (it died
    on the spot, leaving both)."""
    import signal

    proc = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "1M", metrics=False)
    try:
        proc.proc.send_signal(signal.SIGHUP)
        assert proc.wait(15) == 0, proc.log_text()
        assert not list(tmp_path.glob("*.sock")) and not list(tmp_path.glob("*-kv-disk")), list(tmp_path.iterdir())
    finally:
        proc.stop()
