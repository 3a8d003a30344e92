"""Prompt work (parsing big bodies, rendering, tokenizing) on worker threads, a few at a time.

The event loop never renders or tokenizes a long prompt itself, so streams and
``/health`` keep answering; the semaphore bounds how many such jobs hold their
memory at once, so N huge requests queue instead of piling up. Pictures are
decoded under slots of their own (``run_image``), so requests full of big
images queue behind each other, not in front of text prompts. One per app
(``PROMPT_WORK``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")
PROMPT_WORK = web.AppKey("ignis_prompt_work", object)
DEFAULT_WORKERS = 2


class PromptWork:
    def __init__(self, workers: int = DEFAULT_WORKERS, image_workers: int = DEFAULT_WORKERS):
        self._slots = asyncio.Semaphore(workers)
        self._image_slots = asyncio.Semaphore(image_workers)

    async def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on a worker thread once a slot is free."""
        async with self._slots:
            return await asyncio.to_thread(fn, *args)

    async def run_image(self, fn: Callable[..., T], *args) -> T:
        """``run`` for a picture's decoding, under the image slots."""
        async with self._image_slots:
            return await asyncio.to_thread(fn, *args)


def prompt_work(request: web.Request) -> PromptWork:
    return request.app[PROMPT_WORK]
