"""Streaming clients for bench/gateway_overhead.py: one process, ``--streams`` concurrent SSE streams.

    python bench/sse_clients.py --url URL --streams K --first-slot S --counters FILE --pieces-file FILE

Each stream is a loop of streamed requests of ``--max-tokens`` tokens until
SIGTERM, of the ``--api`` asked for:

    completions  POST /v1/completions, a token-id prompt whose first id is ``SLOT_BASE + slot``
    chat         POST /v1/chat/completions, one user message, ``seed`` = ``SLOT_BASE + slot``
    responses    POST /v1/responses, the same message as input, the same seed

 It counts the tokens it has read into its slot of the counters file
(int64 per slot), exactly: every token the benchmark's engines send is one of
the pieces (``--pieces-file``, cycled from the start of each request), so the
text length read so far says how many tokens it holds; the usage chunk at the
end settles the count. The null engine paces each stream by that counter,
the benchmark reads the sum. Prints ``READY`` once its streams are started.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import mmap
import signal
import sys
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import uvloop

SLOT_BASE = 1000  # as bench/null_engine.py


class TokenCounter:
    """Tokens held in a text that is the pieces cycled from the start."""

    def __init__(self, pieces: list[str]):
        self.ends, total = [], 0
        for p in pieces:
            total += len(p)
            self.ends.append(total)
        self.per_cycle, self.n = total, len(pieces)

    def tokens(self, chars: int) -> int:
        cycles, rest = divmod(chars, self.per_cycle)
        return cycles * self.n + bisect.bisect_right(self.ends, rest)


MESSAGE = "Tell me a story."


def request(api: str, slot: int, max_tokens: int) -> tuple[str, bytes]:
    """The path and body of one request of ``api`` for ``slot``."""
    common = {"temperature": 0, "stream": True}
    if api == "completions":
        body = {"prompt": [SLOT_BASE + slot, 11, 12], "max_tokens": max_tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        return "/v1/completions", orjson.dumps(body | common)
    if api == "chat":
        body = {"messages": [{"role": "user", "content": MESSAGE}], "max_tokens": max_tokens, "ignore_eos": True,
                "seed": SLOT_BASE + slot, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", orjson.dumps(body | common)
    body = {"input": [{"role": "user", "content": MESSAGE}], "max_output_tokens": max_tokens,
            "seed": SLOT_BASE + slot, "store": False}
    return "/v1/responses", orjson.dumps(body | common)


def read_chunk(api: str, chunk: dict) -> tuple[str, int | None]:
    """(text of one SSE data object, completion tokens when it is the last one)."""
    if api == "responses":
        kind = chunk["type"]
        if kind == "response.output_text.delta":
            return chunk["delta"], None
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            return "", chunk["response"]["usage"]["output_tokens"]
        return "", None
    if chunk.get("usage"):
        return "", chunk["usage"]["completion_tokens"]
    key = "text" if api == "completions" else "content"
    return "".join((c.get(key) if api == "completions" else c["delta"].get(key)) or ""
                   for c in chunk["choices"]), None


async def stream_loop(session, url: str, slot: int, counts, counter: TokenCounter, max_tokens: int,
                      api: str = "completions") -> None:
    path, payload = request(api, slot, max_tokens)
    headers = {"Content-Type": "application/json"}
    while True:
        chars = seen = 0
        async with session.post(url + path, data=payload, headers=headers) as resp:
            if resp.status != 200:
                raise SystemExit(f"{url} answered {resp.status}: {await resp.text()}")
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                text, done = read_chunk(api, orjson.loads(line[6:]))
                if done is not None:
                    counts[slot] += done - seen
                    break
                chars += len(text)
                now = counter.tokens(chars)
                counts[slot] += now - seen
                seen = now


async def run(args) -> None:
    pieces = orjson.loads(Path(args.pieces_file).read_bytes())
    counter = TokenCounter(pieces)
    f = Path(args.counters).open("r+b")
    counts = np.frombuffer(mmap.mmap(f.fileno(), 0), dtype=np.int64)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    connector = aiohttp.TCPConnector(limit=args.streams + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(stream_loop(session, args.url, args.first_slot + i, counts, counter,
                                                 args.max_tokens, args.api)) for i in range(args.streams)]
        print("READY", flush=True)
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            if t is not stopped and t.exception() is not None:
                raise t.exception()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--first-slot", type=int, default=0)
    ap.add_argument("--counters", required=True)
    ap.add_argument("--pieces-file", required=True)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--api", choices=("completions", "chat", "responses"), default="completions")
    args = ap.parse_args()
    uvloop.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
