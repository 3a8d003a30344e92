"""The transport baseline for bench/gateway_overhead.py: a bare aiohttp SSE server, no gateway code.

    python bench/raw_sse.py --pieces-file FILE

POST /v1/completions with a JSON body (``max_tokens``) answers with
``max_tokens`` SSE events shaped like the gateway's /v1/completions chunks
(same keys, the same text pieces in the same order, read from FILE: a JSON
list of strings), a usage chunk and ``data: [DONE]``, on uvloop like the
gateway. Between events a stream yields to the loop, so concurrent streams
interleave one event per turn as the gateway's do. Prints ``READY URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

MODEL = "ignis-demo"


async def completions(request: web.Request) -> web.StreamResponse:
    pieces: list[str] = request.app["pieces"]
    body = orjson.loads(await request.read())
    n = int(body["max_tokens"])
    head = {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
            "model": MODEL}
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    for i in range(n):
        choice = {"index": 0, "text": pieces[i % len(pieces)], "logprobs": None,
                  "finish_reason": "length" if i == n - 1 else None}
        await resp.write(b"data: " + orjson.dumps(dict(head, choices=[choice], usage=None)) + b"\n\n")
        await asyncio.sleep(0)
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3,
             "prompt_tokens_details": {"cached_tokens": 0}}
    await resp.write(b"data: " + orjson.dumps(dict(head, choices=[], usage=usage)) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def serve(pieces: list[str], host: str) -> None:
    app = web.Application()
    app["pieces"] = pieces
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    print(f"READY http://{host}:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pieces-file", required=True, help="JSON list of the text pieces to stream, cycled")
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args()
    pieces = orjson.loads(Path(args.pieces_file).read_bytes())
    try:
        uvloop.run(serve(pieces, args.host))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
