"""Background runs alone: their event log and followers, their end, the registry's bounds, cancel."""

from __future__ import annotations

import asyncio

import pytest

from ignis.gateway.responses_background import BackgroundRun, BackgroundRuns


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ended(run: BackgroundRun, status: str = "completed") -> None:
    run.end({"id": run.rid, "status": status})


def test_a_follower_gets_every_event_once_in_order_and_stops_at_the_end():
    async def scenario():
        run = BackgroundRun("resp_1")
        run.describe_with(lambda status: {"id": "resp_1", "status": status, "output": []})
        seen: list[bytes] = []

        async def follow(after: int) -> None:
            sent = after + 1
            while True:
                await run.beyond(sent)
                if len(run.events) > sent:
                    seen.extend(run.events[sent:])
                    sent = len(run.events)
                elif run.done:
                    return

        follower = asyncio.create_task(follow(-1))
        for i in range(5):
            run.add(b"e%d" % i)
            await asyncio.sleep(0)  # the follower's turn (or not: it catches up either way)
        run.add(b"e5")
        run.add(b"e6")
        assert not follower.done()
        assert run.response()["status"] == "queued"
        _ended(run)
        await asyncio.wait_for(follower, 5)
        assert seen == [b"e%d" % i for i in range(7)]
        seen.clear()
        await asyncio.wait_for(follow(3), 5)  # a late follower from sequence number 3: what follows it
        assert seen == [b"e4", b"e5", b"e6"]
        assert run.response() == {"id": "resp_1", "status": "completed"}

    asyncio.run(scenario())


def test_a_run_ends_once_and_answers_its_final_state():
    run = BackgroundRun("resp_2")
    with pytest.raises(RuntimeError):
        run.response()  # nothing to show before the response object exists
    states = []
    run.describe_with(lambda status: states.append(status) or {"status": status})
    run.status = "in_progress"
    assert run.response() == {"status": "in_progress"} and not run.done
    _ended(run, "cancelled")
    _ended(run, "completed")  # a second end changes nothing
    assert run.done and run.status == "cancelled" and run.response()["status"] == "cancelled"


def test_finished_runs_are_kept_within_count_and_age_running_ones_always():
    clock = Clock()
    runs = BackgroundRuns(max_finished=2, ttl_s=10, clock=clock)
    running = runs.new("resp_run")
    for i in range(4):
        _ended(runs.new(f"resp_{i}"))
    runs.new("resp_next")  # trimming happens as runs are made and looked up
    assert [rid for rid in ("resp_0", "resp_1", "resp_2", "resp_3") if runs.get(rid)] == ["resp_2", "resp_3"]
    assert runs.get("resp_run") is running and runs.running == 2
    clock.now += 11
    assert runs.get("resp_2") is None and runs.get("resp_3") is None
    clock.now += 1000
    assert runs.get("resp_run") is running  # a running one never expires
    runs.forget("resp_run")
    assert runs.get("resp_run") is None and len(runs) == 1


def test_finished_runs_are_kept_within_their_events_bytes():
    runs = BackgroundRuns(max_finished=10, max_bytes=100)
    for i in range(3):
        run = runs.new(f"resp_{i}")
        run.add(b"x" * 40)
        _ended(run)
    big = runs.new("resp_big")
    big.add(b"x" * 500)  # running: kept whatever it holds
    runs.get("resp_big")
    assert [rid for rid in ("resp_0", "resp_1", "resp_2") if runs.get(rid)] == ["resp_1", "resp_2"]
    _ended(big)
    runs.new("resp_next")
    assert [rid for rid in ("resp_1", "resp_2", "resp_big") if runs.get(rid)] == []  # 580 bytes: all over


def test_cancel_stops_the_task_and_waits_for_its_end():
    async def scenario():
        runs = BackgroundRuns()
        run = runs.new("resp_c")
        run.describe_with(lambda status: {"status": status})
        started = asyncio.Event()

        async def generate():
            try:
                started.set()
                await asyncio.Event().wait()  # a generation that never ends by itself
            except asyncio.CancelledError:
                run.end(run.response() | {"status": "cancelled"})

        run.task = asyncio.create_task(generate())
        await started.wait()
        assert runs.tasks() == [run.task]
        await runs.cancel(run)
        assert run.status == "cancelled" and run.task.done() and runs.tasks() == []
        await runs.cancel(run)  # again: nothing to do
        done = runs.new("resp_d")
        _ended(done)
        await runs.cancel(done)
        assert done.status == "completed"

    asyncio.run(scenario())
