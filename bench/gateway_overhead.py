"""Streaming overhead of the gateway: HTTP + SSE + ZeroMQ against driving the engine directly.

Starts one ``ignis serve`` (engine + gateway, demo model unless --model), then
for 1 and 64 concurrent streams runs the same greedy requests (token-id
prompts, ``ignore_eos``, a fixed ``max_tokens``) twice per repetition:

    direct    Generate messages straight to the engine's ZeroMQ ROUTER, read until every Finished
    gateway   POST /v1/completions with stream=true through the gateway (aiohttp client), read every
              SSE chunk until [DONE]

and reports the median wall time of each, the overhead per streamed token
(gateway wall - direct wall) / tokens, aggregate streamed tokens/s through the
gateway, and the gateway process's own CPU time per token (from /proc; on a
machine with few cores the gateway, the client and the engine share them, so
the wall-time overhead includes CPU taken from the engine). Both paths
alternate within a repetition, after a warm-up, so load drift on a shared
machine hits both. The last line is

    BENCH gateway_overhead us_per_token_1=X us_per_token_64=Y tokens_per_s_64=Z

    python bench/gateway_overhead.py [--model DIR] [--max-tokens N] [--reps R] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

import aiohttp  # noqa: E402
import orjson  # noqa: E402
import zmq  # noqa: E402

from ignis.shared.sampling import SamplingParams  # noqa: E402
from ignis.shared.wire import ENGINE_TO_GATEWAY, Finished, Generate, Refused, TokenBatch  # noqa: E402
from ignis.shared.zmq_queues import connect_dealer  # noqa: E402

CONCURRENCY = (1, 64)
PROMPT = [(7 * i + 11) % 1900 + 50 for i in range(24)]  # a fixed token-id prompt inside the demo vocabulary


def start_serve(args, runtime: str) -> tuple[subprocess.Popen, str, str, Path]:
    log = Path(runtime) / "serve.log"
    argv = [sys.executable, "-m", "ignis.launcher.cli", "serve", "--port", "0", "--runtime-dir", runtime,
            "--instance", "bench", "--decode-lanes", "64", "--kv-pool-tokens", str(args.kv_pool_tokens)]
    if args.model:
        argv += ["--model", args.model]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    endpoint = url = None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        if line.startswith("READY ipc://") or line.startswith("READY tcp://"):
            endpoint = line.split()[1]
        m = re.match(r"ignis serving \S+ on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
        if time.monotonic() > deadline:
            break
    if not (endpoint and url):
        proc.kill()
        raise SystemExit(f"ignis serve did not start:\n{log.read_text()[-3000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its stdout pipe drained
    return proc, endpoint, url, log


def gateway_pid(serve_pid: int) -> int | None:
    """The gateway child of ``ignis serve`` (Linux /proc)."""
    try:
        kids = Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split()
        for pid in kids:
            if b"gateway" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return int(pid)
    except OSError:
        pass
    return None


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of ``pid`` so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def direct_run(channel, concurrency: int, max_tokens: int, tag: str) -> tuple[float, int]:
    """Seconds until every stream finished, and tokens received."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"bench-{tag}-{i}" for i in range(concurrency)]
    t0 = time.perf_counter()
    for rid in ids:
        channel.send(Generate(id=rid, prompt_ids=tuple(PROMPT), sampling=sampling))
    left, tokens = set(ids), 0
    while left:
        msg = channel.get(timeout=120).message
        if isinstance(msg, TokenBatch):
            tokens += sum(len(s.token_ids) for s in msg.streams if s.id in left)
        elif isinstance(msg, Finished):
            left.discard(msg.id)
        elif isinstance(msg, Refused):
            raise SystemExit(f"the engine refused a benchmark request: {msg.reason}: {msg.message}")
    return time.perf_counter() - t0, tokens


async def one_stream(session: aiohttp.ClientSession, url: str, max_tokens: int) -> int:
    payload = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}
    tokens = 0
    async with session.post(url + "/v1/completions", data=orjson.dumps(payload),
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise SystemExit(f"the gateway answered {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens


async def gateway_run(url: str, concurrency: int, max_tokens: int) -> tuple[float, int]:
    limits = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=limits, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one_stream(session, url, max_tokens) for _ in range(concurrency)))
        return time.perf_counter() - t0, sum(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per stream")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per concurrency (median reported)")
    ap.add_argument("--kv-pool-tokens", type=int, default=32768, help="engine KV pool (enough for 64 streams)")
    ap.add_argument("--quick", action="store_true", help="a few tokens, one repetition (for tests)")
    args = ap.parse_args()
    if args.quick:
        args.max_tokens, args.reps = 4, 1
    with tempfile.TemporaryDirectory(prefix="ignis-bench-gw-") as runtime:
        proc, endpoint, url, log = start_serve(args, runtime)
        ctx = zmq.Context()
        channel = connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY, name="bench").start()
        gw_pid = gateway_pid(proc.pid)
        try:
            results = {}
            for c in CONCURRENCY:
                direct_run(channel, c, args.max_tokens, f"warm{c}")  # warm-up: lanes, pages, retained prefix
                asyncio.run(gateway_run(url, c, args.max_tokens))
                d_times, g_times, tokens, cpu = [], [], 0, 0.0
                for r in range(args.reps):
                    dt, dn = direct_run(channel, c, args.max_tokens, f"{c}-{r}")
                    cpu0 = cpu_seconds(gw_pid)
                    gt, gn = asyncio.run(gateway_run(url, c, args.max_tokens))
                    cpu += cpu_seconds(gw_pid) - cpu0
                    if dn != gn or dn != c * args.max_tokens:
                        raise SystemExit(f"token counts differ: direct {dn}, gateway {gn}, "
                                         f"expected {c * args.max_tokens}")
                    d_times.append(dt)
                    g_times.append(gt)
                    tokens = gn
                print(f"# {c} streams, seconds per repetition: direct {' '.join(f'{t:.3f}' for t in d_times)}; "
                      f"gateway {' '.join(f'{t:.3f}' for t in g_times)}", flush=True)
                d, g = statistics.median(d_times), statistics.median(g_times)
                results[c] = (d, g, tokens, cpu / (args.reps * tokens))
        finally:
            channel.close()
            ctx.term()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{'streams':>8} {'tokens':>8} {'direct s':>10} {'gateway s':>10} {'us/token':>10} {'gateway tok/s':>14} "
          f"{'gateway cpu us/token':>21}")
    for c, (d, g, n, cpu) in results.items():
        print(f"{c:>8} {n:>8} {d:>10.3f} {g:>10.3f} {(g - d) / n * 1e6:>10.1f} {n / g:>14.1f} {cpu * 1e6:>21.1f}")
    (d1, g1, n1, _), (d64, g64, n64, _) = results[1], results[64]
    print(f"BENCH gateway_overhead us_per_token_1={(g1 - d1) / n1 * 1e6:.1f} "
          f"us_per_token_64={(g64 - d64) / n64 * 1e6:.1f} tokens_per_s_64={n64 / g64:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
