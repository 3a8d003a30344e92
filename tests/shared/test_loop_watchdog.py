"""The loop watchdog alone: when it fires, when it does not; the gateway's beat as its stall; the stop deadline.

The whole path (a stuck engine round aborted with its stacks, the engine
restarted by ``ignis serve``) is tests/launcher/test_serve.py's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ignis.gateway.cli import stop_deadline_s
from ignis.gateway.config import GatewayConfig
from ignis.shared.loop_watchdog import LoopWatchdog, StopDeadline
from ignis.shared.sdnotify import LoopBeat


def test_it_fires_once_the_stall_reaches_the_timeout_and_not_before():
    stall, told = [0.0], []
    dog = LoopWatchdog(5.0, lambda: stall[0], abort=told.append)
    assert not dog.check() and told == []
    stall[0] = 4.9
    assert not dog.check()
    stall[0] = 5.0
    assert dog.check()
    assert len(told) == 1 and "engine loop has been in one turn for 5 s" in told[0] and "--watchdog-timeout 5" in told[0]


def test_its_thread_aborts_a_stuck_loop_and_is_off_at_zero():
    fired = threading.Event()
    started = time.monotonic()
    dog = LoopWatchdog(0.2, lambda: time.monotonic() - started, abort=lambda _: fired.set(), every_s=0.05).start()
    assert fired.wait(10), "the watchdog did not fire"
    dog.stop()
    off = LoopWatchdog(0, lambda: 1e9, abort=lambda _: pytest.fail("an off watchdog fired")).start()
    assert not off._thread.is_alive()
    off.stop()


def test_the_gateways_beat_is_its_stall_and_its_flag_is_the_engines():
    async def scenario():
        beat = LoopBeat(asyncio.get_running_loop(), every_s=0.01)
        await asyncio.sleep(0.05)
        assert beat.stall() < 0.05
        time.sleep(0.3)  # the loop is stuck in this call
        return beat.stall()

    assert asyncio.run(scenario()) >= 0.25
    assert GatewayConfig().watchdog_timeout == 300.0
    with pytest.raises(ValueError, match="--watchdog-timeout"):
        GatewayConfig(watchdog_timeout=-1)


def test_a_stop_deadline_fires_after_its_time_unless_cancelled():
    told = []
    fired = threading.Event()
    StopDeadline(0.05, "gateway", exit=lambda m: (told.append(m), fired.set())).start()
    assert fired.wait(10), "the deadline did not fire"
    assert "the gateway has not stopped 0.05 s after it was told to" in told[0]
    cancelled = StopDeadline(0.05, "gateway", exit=lambda m: pytest.fail("a cancelled deadline fired")).start()
    cancelled.cancel()
    cancelled._timer.join(5)
    assert stop_deadline_s(5) == 25 and stop_deadline_s(0) == 10


def test_a_process_stuck_in_its_stop_exits_1_with_its_stacks():
    script = textwrap.dedent("""
        import threading
        from ignis.shared.logs import setup_logging
        from ignis.shared.loop_watchdog import StopDeadline

        def stuck_in_cleanup():
            threading.Event().wait()  # a close that never returns

        setup_logging("gateway")
        StopDeadline(0.3, "gateway").start()
        stuck_in_cleanup()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert "CRITICAL the gateway has not stopped 0.3 s after it was told to" in proc.stderr, proc.stderr
    assert "stuck_in_cleanup" in proc.stderr, proc.stderr  # the stuck frame is in the log
