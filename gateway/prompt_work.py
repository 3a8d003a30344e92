"""Prompt work (parsing big bodies, rendering, tokenizing) on worker threads, a few at a time.

The event loop never renders or tokenizes a long prompt itself, so streams and
``/health`` keep answering; the semaphore bounds how many such jobs hold their
memory at once, so N huge requests queue instead of piling up. One per app
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
    def __init__(self, workers: int = DEFAULT_WORKERS):
        self._slots = asyncio.Semaphore(workers)

    async def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on a worker thread once a slot is free."""
        async with self._slots:
            return await asyncio.to_thread(fn, *args)


def prompt_work(request: web.Request) -> PromptWork:
    return request.app[PROMPT_WORK]
