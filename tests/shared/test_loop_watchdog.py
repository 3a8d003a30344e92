"""The loop watchdog alone: when it fires, when it does not; the gateway's beat as its stall.

The whole path (a stuck engine round aborted with its stacks, the engine
restarted by ``ignis serve``) is tests/launcher/test_serve.py's.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ignis.gateway.config import GatewayConfig
from ignis.shared.loop_watchdog import LoopWatchdog
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
