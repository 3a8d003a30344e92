"""The engine stops on SIGTERM however the signals arrive: a burst of them must not wedge it."""

from __future__ import annotations

from tests.engine.engine_process import EngineProcess
from tests.signal_burst import EXITED_ON_SIGTERM, sigterm_burst


def test_a_burst_of_sigterms_stops_the_engine(tmp_path):
    eng = EngineProcess(tmp_path, "--decode-lanes", "2", "--kv-pool-tokens", "1024")
    try:
        sigterm_burst(eng.proc.pid)
        assert eng.proc.wait(30) in EXITED_ON_SIGTERM, eng.log_text()
    finally:
        eng.stop()
