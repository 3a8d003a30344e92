"""stream_sse's steady state: once the headers are out, the inbox's pump writes the deltas.

A real aiohttp server in this process runs ``stream_sse`` over a Generation
whose engine side is a stub; the test puts engine answers on its inbox in
separate turns of the loop, as the engine reader would, and reads the SSE
body with a real client.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from ignis.gateway.choice import ChoiceState
from ignis.gateway.generation import Generation
from ignis.gateway.responses import sse, stream_sse
from ignis.shared.sampling import SamplingParams
from ignis.shared.wire import Finished, Generate, Usage
from tests.gateway.test_generation import Routes

ID = "cmpl-p-0"
DEADLINE_S = 30  # a failure bound for a stream that never ends, not a speed requirement


async def serve(tokenizer, feed, on_pump=None) -> tuple[list[dict | str], list, list[int]]:
    """Run one streamed request whose engine answers ``feed(gen)`` puts (called as the handler starts), and
    ``on_pump(gen)`` once the inbox is given its pump; returns the client's events, the pumps the inbox was
    given (None: taken back) and the token counts told to the metrics."""
    gen = Generation(Routes(), [Generate(id=ID, prompt_ids=(1, 2), sampling=SamplingParams())],
                     [ChoiceState(0, tokenizer)])
    pumps, counted = [], []
    given = gen.inbox.pump_with

    def record(pump):
        pumps.append(pump)
        given(pump)
        if pump is not None and on_pump is not None:
            asyncio.get_running_loop().call_soon(on_pump, gen)

    gen.inbox.pump_with = record

    async def handler(request):
        asyncio.get_running_loop().call_soon(feed, gen)
        return await stream_sse(request, gen, [sse({"hello": 1})], lambda d: sse({"text": d.content}), None,
                                counted.append)

    app = web.Application()
    app.router.add_post("/", handler)
    async with TestServer(app) as server, aiohttp.ClientSession() as session, asyncio.timeout(DEADLINE_S):
        async with session.post(server.make_url("/")) as resp:
            body = (await resp.read()).decode()
    events = [e[len("data: "):] for e in body.split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events], pumps, counted


def later(gen: Generation, items: list, turns: int = 3) -> None:
    """Put ``items`` on the inbox one at a time, each a few loop turns after the previous."""
    loop = asyncio.get_running_loop()

    def step(i: int, wait: int) -> None:
        if wait:
            loop.call_soon(step, i, wait - 1)
            return
        gen.inbox.put_nowait(items[i])
        if i + 1 < len(items):
            loop.call_soon(step, i + 1, turns)

    step(0, turns)


async def test_tokens_arriving_turn_by_turn_are_written_by_the_pump(demo_tokenizer):
    ids = demo_tokenizer.encode("one two three")
    items = [(ID, (t,), None) for t in ids] + [(ID, Finished(ID, "stop", Usage(2, len(ids))), None)]
    events, pumps, counted = await serve(demo_tokenizer, lambda gen: later(gen, items))
    assert events[0] == {"hello": 1} and events[-1] == "[DONE]"
    assert "".join(e["text"] for e in events[1:-1]) == "one two three"
    assert len(events) - 2 >= len(ids)  # one event per turn that brought a token, and the final delta
    assert len(pumps) == 2 and pumps[0] is not None and pumps[1] is None  # pumped, then taken back
    assert sum(counted) == len(ids)


async def test_a_failure_behind_tokens_in_one_turn_follows_their_event(demo_tokenizer):
    ids = demo_tokenizer.encode("partial")

    def burst(gen):  # all in one turn, once the handler waits on its pump
        for t in ids:
            gen.inbox.put_nowait((ID, (t,), None))
        gen.inbox.put_nowait((ID, Finished(ID, "error", Usage(2, 1), message="scripted"), None))

    events, pumps, _ = await serve(demo_tokenizer, lambda gen: None, on_pump=burst)
    assert len(pumps) == 2 and pumps[0] is not None
    assert events[1] == {"text": "partial"}
    assert events[2]["error"]["message"] == "scripted" and events[3] == "[DONE]"
    assert len(events) == 4
