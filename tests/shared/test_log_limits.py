"""RateLimitedLog: a burst, then a steady rate, and the count of held lines on the next one."""

from __future__ import annotations

import logging

from ignis.shared.log_limits import RateLimitedLog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_burst_then_rate_and_the_suppressed_count(caplog):
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("test.limits"), per_s=2.0, burst=3, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.limits"):
        passed = [limited.warning("frame %d", i) for i in range(1000)]
        assert sum(passed) == 3 and limited.suppressed == 997
        clock.t = 0.5  # one token back
        assert limited.warning("frame %d", 1000)
        assert not limited.warning("frame %d", 1001)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[:3] == ["frame 0", "frame 1", "frame 2"]
    assert lines[3] == "frame 1000 (997 similar lines suppressed)"
    assert limited.suppressed == 1


def test_a_thousand_garbage_frames_log_a_bounded_number_of_lines(caplog):
    import zmq

    from ignis.shared.tier_wire import ENGINE_TO_TIERD
    from ignis.shared.zmq_queues import bind_router

    chan = bind_router(zmq.Context.instance(), "inproc://log-limits", ENGINE_TO_TIERD, name="t")
    try:
        with caplog.at_level(logging.WARNING, logger="ignis.shared.zmq_queues"):
            for _ in range(1000):
                chan._garbage(None, [b"x"], "not JSON")
        assert chan.garbage_count == 1000
        assert len([r for r in caplog.records if "malformed" in r.getMessage()]) <= 20
    finally:
        chan.close()
