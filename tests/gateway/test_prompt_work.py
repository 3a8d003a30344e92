"""Prompt work on worker threads: text prompts never queue behind pictures being decoded."""

from __future__ import annotations

import asyncio
import threading

from ignis.gateway.prompt_work import PromptWork


def test_text_prompt_work_runs_while_every_image_slot_is_busy():
    release = threading.Event()

    def slow_decode():
        assert release.wait(30)
        return "picture"

    async def main():
        work = PromptWork(workers=2, image_workers=2)
        images = [asyncio.create_task(work.run_image(slow_decode)) for _ in range(4)]
        await asyncio.sleep(0)
        # both image slots are held and two more decodes wait; text work still gets its own slots
        text = await asyncio.wait_for(asyncio.gather(work.run(len, "abc"), work.run(len, "de")), 10)
        assert text == [3, 2]
        assert not any(t.done() for t in images)
        release.set()
        assert await asyncio.wait_for(asyncio.gather(*images), 30) == ["picture"] * 4

    asyncio.run(main())


def test_image_work_is_bounded_by_its_slots():
    running, peak, lock = [0], [0], threading.Lock()
    gate = threading.Event()

    def decode():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        assert gate.wait(30)
        with lock:
            running[0] -= 1

    async def main():
        work = PromptWork(workers=2, image_workers=2)
        tasks = [asyncio.create_task(work.run_image(decode)) for _ in range(5)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while running[0] < 2 and loop.time() < deadline:  # poll with a deadline: both slots taken
            await asyncio.sleep(0.01)
        assert running[0] == 2
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)

    asyncio.run(main())
    assert peak[0] == 2
