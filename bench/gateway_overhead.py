"""The gateway's cost per streamed token, against a bare aiohttp SSE server doing the same writes.

Starts, in one process tree:

    raw       bench/raw_sse.py: aiohttp on uvloop writing the same SSE events (same keys, same text pieces,
              one event per token) with no gateway code: the transport's own cost
    gateway   the real gateway (``ignis gateway``, the demo model's tokenizer and detokenizer) in front of
    null      bench/null_engine.py: the real ZeroMQ protocol, no model; one TokenBatch per round for all
              streams, each stream paced by what its client has read (no backlog, no idle engine)

and for 1, 16, 64 and 256 concurrent streams drives each server with
bench/sse_clients.py processes (each stream a loop of streamed
/v1/completions requests of ``--max-tokens`` tokens) for ``--seconds``
after a warm-up; raw and gateway alternate at each concurrency, so load
drift on a shared machine hits both. The tokens are those of an English
text in the real tokenizer (each decodes to at least one character, so a
client counts its tokens from the text length, exactly).

Reported per server and concurrency: tokens read by the clients in the
window, wall throughput, and the server process's CPU time (user + system,
from /proc) per token; the gateway's ratio to raw is a ratio of CPU times
per token, never a difference of walls. The last line is

    BENCH gateway_overhead us_per_token_1=A us_per_token_64=B tokens_per_s_64=C ratio_to_raw_64=D tokens_per_s_256=E

    ... chat_us_per_token=F responses_us_per_token=G responses_to_chat=H

where A and B are the gateway's CPU microseconds per token and C, E its
wall throughput; F and G the same CPU cost at 64 streams of
/v1/chat/completions and /v1/responses (one user message rendered through
the demo model's chat template, the text through the chat path's parsers;
the null engine paces them by their seed), H = G / F.

    python bench/gateway_overhead.py [--seconds S] [--clients P] [--max-tokens N] [--quick] [--profile FILE]
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

import numpy as np  # noqa: E402
import orjson  # noqa: E402

CONCURRENCY = (1, 16, 64, 256)
TEXT = ("The quick brown fox jumps over the lazy dog while the patient engineer measures every step of the "
        "server, counting each token that leaves the gateway and each byte that crosses the socket. ")
BENCH_DIR = Path(__file__).resolve().parent
API_CASES = ("chat", "responses")
API_STREAMS = 64
"""Streams of the chat and responses cases (one user message through the chat template)."""


def pieces_of_text() -> tuple[list[int], list[str]]:
    """Token ids of TEXT in the demo model's tokenizer, and each one's text (non-empty, context free)."""
    from ignis.gateway.tokenizer import load_model_files
    from ignis.shared.demo import ensure_demo_model

    tok = load_model_files(ensure_demo_model()).tokenizer
    ids = tok.encode(TEXT)
    pieces = [tok.decode([i]) for i in ids]
    if "".join(pieces) != tok.decode(ids) or not all(pieces):
        raise SystemExit("the benchmark text does not split into context-free tokens")
    return ids, pieces


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(argv: list[str], log: Path, ready: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start a process and wait for its line starting with ``ready``; returns it and the rest of that line."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    for line in proc.stdout:
        if line.startswith(ready):
            return proc, line[len(ready):].strip()
    proc.kill()
    raise SystemExit(f"{argv[1]} did not start:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Counters:
    """The clients' per-slot token counters (a file of int64, shared with clients and the null engine)."""

    SLOTS = 512

    def __init__(self, path: Path):
        path.write_bytes(bytes(8 * self.SLOTS))
        self.path = path
        self._file = path.open("r+b")
        self.values = np.frombuffer(mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.int64)

    def total(self) -> int:
        return int(self.values.sum())


def measure(url: str, server_pid: int, streams: int, args, counters: Counters, pieces_file: Path,
            logs: Path, tag: str, api: str = "completions") -> dict:
    """Drive ``url`` with ``streams`` streams; tokens, seconds and server CPU over the measured window."""
    procs = []
    nproc = min(args.clients, streams)
    per, first = [streams // nproc + (i < streams % nproc) for i in range(nproc)], 0
    try:
        for i, k in enumerate(per):
            procs.append(start([sys.executable, str(BENCH_DIR / "sse_clients.py"), "--url", url, "--streams", str(k),
                                "--first-slot", str(first), "--counters", str(counters.path), "--pieces-file",
                                str(pieces_file), "--max-tokens", str(args.max_tokens), "--api", api],
                               logs / f"clients-{tag}-{streams}-{i}.log", "READY")[0])
            first += k
        time.sleep(args.warmup)
        n0, c0, t0 = counters.total(), cpu_seconds(server_pid), time.perf_counter()
        time.sleep(args.seconds)
        n1, c1, t1 = counters.total(), cpu_seconds(server_pid), time.perf_counter()
    finally:
        for p in procs:
            stop(p)
    for p in procs:
        if p.returncode not in (0, -signal.SIGTERM):
            raise SystemExit(f"a client of {tag} failed:\n" + "".join(
                f.read_text()[-2000:] for f in logs.glob(f"clients-{tag}-{streams}-*.log")))
    tokens = n1 - n0
    if tokens <= 0:
        raise SystemExit(f"{tag} streamed no tokens at {streams} streams")
    return {"tokens": tokens, "seconds": t1 - t0, "cpu": c1 - c0, "clients": nproc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measured window per server and concurrency")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of streaming before the window")
    ap.add_argument("--clients", type=int, default=2, help="client processes (fewer when fewer streams)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per request")
    ap.add_argument("--window", type=int, default=2, help="unread tokens a null-engine stream may have")
    ap.add_argument("--profile", default=None, help="write a cProfile of the gateway to this file")
    ap.add_argument("--quick", action="store_true", help="short windows (for tests)")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.max_tokens = 0.5, 0.6, 64
    ids, pieces = pieces_of_text()
    with tempfile.TemporaryDirectory(prefix="ignis-bench-gw-") as tmp:
        tmp = Path(tmp)
        pieces_file = tmp / "pieces.json"
        pieces_file.write_bytes(orjson.dumps(pieces))
        counters = Counters(tmp / "counters")
        endpoint = f"ipc://{tmp}/null-engine.sock"
        procs = []
        try:
            null, _ = start([sys.executable, str(BENCH_DIR / "null_engine.py"), "--endpoint", endpoint, "--tokens",
                             ",".join(map(str, ids)), "--credits", str(counters.path), "--window", str(args.window)],
                            tmp / "null.log", "READY")
            procs.append(null)
            gw_argv = [sys.executable, "-m", "ignis.launcher.cli", "gateway", "--engine-endpoint", endpoint,
                       "--port", "0"]
            if args.profile:
                gw_argv[1:1] = ["-m", "cProfile", "-o", os.path.abspath(args.profile)]
            gateway, gw_url = start(gw_argv, tmp / "gateway.log", "READY ")
            procs.append(gateway)
            raw, raw_url = start([sys.executable, str(BENCH_DIR / "raw_sse.py"), "--pieces-file", str(pieces_file)],
                                 tmp / "raw.log", "READY ")
            procs.append(raw)
            results = {}
            for c in CONCURRENCY:
                r = measure(raw_url, raw.pid, c, args, counters, pieces_file, tmp, "raw")
                n0 = cpu_seconds(null.pid)
                g = measure(gw_url, gateway.pid, c, args, counters, pieces_file, tmp, "gateway")
                g["null_cpu"] = cpu_seconds(null.pid) - n0
                results[c] = (r, g)
                print(f"# {c} streams ({g['clients']} client processes): raw {r['tokens']} tokens in "
                      f"{r['seconds']:.2f} s, cpu {r['cpu']:.2f} s; gateway {g['tokens']} tokens in "
                      f"{g['seconds']:.2f} s, cpu {g['cpu']:.2f} s", flush=True)
            apis = {}
            for api in API_CASES:  # the templated endpoints, alternated, at API_STREAMS
                apis[api] = measure(gw_url, gateway.pid, API_STREAMS, args, counters, pieces_file, tmp, api, api)
                print(f"# {API_STREAMS} streams of {api}: {apis[api]['tokens']} tokens in "
                      f"{apis[api]['seconds']:.2f} s, cpu {apis[api]['cpu']:.2f} s", flush=True)
        finally:
            for p in reversed(procs):  # the gateway first, so it writes its profile while the engine is up
                stop(p)
    print(f"{'streams':>8} {'clients':>8} {'raw tok/s':>10} {'raw us/tok':>11} {'gw tok/s':>10} {'gw us/tok':>10} "
          f"{'null us/tok':>12} {'ratio':>6}")
    row = {}
    for c, (r, g) in results.items():
        r_us, g_us = r["cpu"] / r["tokens"] * 1e6, g["cpu"] / g["tokens"] * 1e6
        ratio = g_us / r_us if r_us > 0 else float("inf")
        row[c] = (g_us, g["tokens"] / g["seconds"], ratio)
        print(f"{c:>8} {g['clients']:>8} {r['tokens'] / r['seconds']:>10.0f} {r_us:>11.1f} "
              f"{g['tokens'] / g['seconds']:>10.0f} {g_us:>10.1f} {g['null_cpu'] / g['tokens'] * 1e6:>12.1f} "
              f"{ratio:>6.2f}")
    api_us = {api: a["cpu"] / a["tokens"] * 1e6 for api, a in apis.items()}
    for api, a in apis.items():
        print(f"{API_STREAMS:>8} {a['clients']:>8} {api:>10} {a['tokens'] / a['seconds']:>10.0f} tok/s "
              f"{api_us[api]:>10.1f} us/tok")
    print(f"BENCH gateway_overhead us_per_token_1={row[1][0]:.1f} us_per_token_64={row[64][0]:.1f} "
          f"tokens_per_s_64={row[64][1]:.0f} ratio_to_raw_64={row[64][2]:.2f} tokens_per_s_256={row[256][1]:.0f} "
          f"chat_us_per_token={api_us['chat']:.1f} responses_us_per_token={api_us['responses']:.1f} "
          f"responses_to_chat={api_us['responses'] / api_us['chat']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
