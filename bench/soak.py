"""Soak: N streaming clients for T minutes against ``ignis serve`` with every tier on; nothing may leak.

``ignis serve`` runs the demo model (unless --model) with a small KV pool, a
small KV-RAM arena and a KV-disk directory, so retained entries move through
all three tiers. Each client runs conversations without pause: a turn is a
streamed chat request on one of a few shared system prompts (hits on the
system block), the next turn of its conversation (hits on the checkpoint,
wherever it went), or a prompt of its own (a miss); 20% of requests close the
connection after the first chunks (a mid-stream disconnect, which must abort
the request in the engine).

Every ``--sample-s`` (60 s; 2.5 s in quick mode) it records each process's RSS
and the engine's and tierd's counters. At the end the clients stop, the
service is left to go idle (bounded), and the idle values are checked:
no request running or waiting, no live eviction, no tierd copy in flight, every
KV page in use held by a retained entry (``leaked_pages`` counts the others)
and every used slot by an entry (``leaked_slots``). RSS growth is from the
first sample after warm-up (a quarter of the run) to the last, the largest of
the three processes. The last line is::

    BENCH soak minutes=A streams=B requests=C errors_5xx=D leaked_pages=E rss_growth_pct=F ...

with goals D = 0, E = 0, F < 5 over 60 minutes.

    python bench/soak.py [--streams 64] [--minutes 60] [--model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402
from serve_process import PROCESSES, children, start_serve, stop_serve  # noqa: E402

use_checkout()

import aiohttp  # noqa: E402

CHAT = "/v1/chat/completions"
WORDS = ("river stone lantern copper meadow signal harbor ember orchard quartz violet thunder canyon "
         "glacier compass ribbon falcon marble willow beacon").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric_values(text: str) -> dict[str, float]:
    """``name`` (labels dropped, samples of one name summed) -> value, from a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def labelled(text: str, name: str, label: str) -> dict[str, float]:
    """``label`` value -> sample value, for the samples of metric ``name``."""
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{re.escape(name)}{{([^}}]*)}} (\S+)$', text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = labels.get(label, "")
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


class Load:
    """The clients' tallies."""

    def __init__(self):
        self.requests = self.ok = self.errors_5xx = self.errors_4xx = self.failed = self.disconnects = 0
        self.cached_tokens = 0


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def one_turn(session: aiohttp.ClientSession, url: str, messages: list[dict], rng: random.Random,
                   load: Load) -> str | None:
    """One streamed request; the reply's text, or None (disconnected on purpose, or failed)."""
    cut = rng.random() < 0.2
    body = {"model": "ignis-demo", "messages": messages, "max_tokens": rng.randint(8, 24), "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    load.requests += 1
    text, chunks = [], 0
    try:
        async with session.post(url + CHAT, json=body) as resp:
            if resp.status >= 500:
                load.errors_5xx += 1
                await resp.read()
                return None
            if resp.status != 200:
                load.errors_4xx += 1
                await resp.read()
                return None
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    details = chunk["usage"].get("prompt_tokens_details") or {}
                    load.cached_tokens += details.get("cached_tokens") or 0
                for choice in chunk.get("choices", ()):
                    text.append(choice.get("delta", {}).get("content") or "")
                chunks += 1
                if cut and chunks >= 2:
                    load.disconnects += 1
                    resp.close()
                    return None
        load.ok += 1
        return "".join(text)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
        load.failed += 1
        return None


async def client(worker: int, url: str, systems: list[str], stop_at: float, load: Load) -> None:
    rng = random.Random(worker)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < stop_at:
            unique = rng.random() < 0.2
            system = sentence(rng, 300) if unique else rng.choice(systems)
            messages = [{"role": "system", "content": system}]
            for _turn in range(rng.randint(1, 4)):
                if time.monotonic() >= stop_at:
                    return
                messages.append({"role": "user", "content": sentence(rng, rng.randint(5, 40))})
                reply = await one_turn(session, url, messages, rng, load)
                if reply is None:
                    break  # a cut or failed turn ends the conversation
                messages.append({"role": "assistant", "content": reply})


async def run_load(url: str, streams: int, seconds: float, load: Load) -> None:
    rng = random.Random(0)
    systems = [sentence(rng, 400 + 100 * i) for i in range(4)]
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(client(i, url, systems, stop_at, load) for i in range(streams)))


def scrape(port: int) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def sample(pids: dict[str, int], ports: dict[str, int]) -> dict:
    eng, tierd = metric_values(scrape(ports["engine"])), metric_values(scrape(ports["tierd"]))
    return {"rss": {name: rss_mb(pid) for name, pid in pids.items()}, "engine": eng, "tierd": tierd}


def idle_values(s: dict) -> dict[str, float]:
    e, t = s["engine"], s["tierd"]
    used_slots = e.get("ignis:retained_slots_total", 0) - e.get("ignis:retained_slots_free", 0)
    return {"running": e.get("ignis:num_requests_running", 0), "waiting": e.get("ignis:num_requests_waiting", 0),
            "evicting": e.get("ignis:live_evicting", 0), "copies": t.get("ignis:tierd_copies_in_flight", 0),
            "leaked_pages": e.get("ignis:kv_pool_pages_used", 0) - e.get("ignis:retained_pages", 0),
            "leaked_slots": used_slots - e.get("ignis:retained_entries", 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=60.0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true",
                    help="8 streams for 10 s, a sample every 2.5 s, a KV-RAM arena of 8M (KV-disk in use sooner)")
    args = ap.parse_args()
    arena = "24M"
    if args.quick:
        args.streams, args.minutes, args.sample_s, arena = 8, 10 / 60, 2.5, "8M"
    ports = {"engine": free_port(), "tierd": free_port()}
    with tempfile.TemporaryDirectory(prefix="ignis-soak-") as runtime:
        flags = ["--kv-pool-tokens", "12288", "--decode-lanes", "16", "--reuse-kv-host-pool-bytes", arena,
                 "--kv-disk-dir", str(Path(runtime) / "kv-disk"), "--kv-disk-bytes", "512M",
                 "--metrics-port", str(ports["engine"]), "--tierd-metrics-port", str(ports["tierd"]),
                 "--metrics-host", "127.0.0.1"]
        proc, url, _log = start_serve(runtime, "soak", flags, args.model)
        try:
            return soak(proc, url, ports, args)
        finally:
            stop_serve(proc)


def soak(proc: subprocess.Popen, url: str, ports: dict[str, int], args) -> int:
    pids = children(proc.pid)
    seconds = args.minutes * 60
    load = Load()
    samples: list[tuple[float, dict]] = []
    t0 = time.monotonic()

    def sampler(stop: threading.Event) -> None:
        while not stop.wait(args.sample_s):
            samples.append((time.monotonic() - t0, sample(pids, ports)))

    stop = threading.Event()
    thread = threading.Thread(target=sampler, args=(stop,), daemon=True)
    thread.start()
    asyncio.run(run_load(url, args.streams, seconds, load))
    stop.set()
    thread.join()
    # idle: nothing running or waiting, no copy in flight (bounded)
    deadline = time.monotonic() + 60
    while True:
        last = sample(pids, ports)
        idle = idle_values(last)
        if all(idle[k] == 0 for k in ("running", "waiting", "evicting", "copies")) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    samples.append((time.monotonic() - t0, last))
    print(f"{'t_s':>6} " + " ".join(f"{p + '_mb':>11}" for p in PROCESSES) +
          f" {'running':>8} {'pages':>6} {'retained':>8} {'lower':>6} {'arena_mb':>9} {'disk_mb':>8}")
    for t, s in samples:
        e, td = s["engine"], s["tierd"]
        print(f"{t:6.0f} " + " ".join(f"{s['rss'].get(p, float('nan')):11.1f}" for p in PROCESSES) +
              f" {e.get('ignis:num_requests_running', 0):8.0f} {e.get('ignis:kv_pool_pages_used', 0):6.0f}"
              f" {e.get('ignis:retained_pages', 0):8.0f} {e.get('ignis:retained_lower_entries', 0):6.0f}"
              f" {td.get('ignis:tierd_arena_used_bytes', 0) / 2**20:9.1f}"
              f" {td.get('ignis:tierd_disk_used_bytes', 0) / 2**20:8.1f}")
    hits = labelled(scrape(ports["engine"]), "ignis:reuse_hits_total", "tier")
    warm = [s for t, s in samples if t >= seconds / 4] or [samples[-1][1]]
    growth = max((samples[-1][1]["rss"][p] - warm[0]["rss"][p]) / warm[0]["rss"][p] * 100
                 for p in pids if p in warm[0]["rss"])
    print(f"requests {load.requests}: ok {load.ok}, 5xx {load.errors_5xx}, 4xx {load.errors_4xx}, "
          f"failed {load.failed}, disconnected on purpose {load.disconnects}; cached tokens {load.cached_tokens}; "
          f"hits by tier {dict(sorted(hits.items()))}; idle {idle}")
    alive = int(proc.poll() is None and all(Path(f"/proc/{pid}").exists() for pid in pids.values()))
    fields = {"minutes": f"{args.minutes:.2f}", "streams": args.streams, "requests": load.requests,
              "errors_5xx": load.errors_5xx, "leaked_pages": int(idle["leaked_pages"]),
              "rss_growth_pct": f"{growth:.2f}", "leaked_slots": int(idle["leaked_slots"]),
              "failed": load.failed, "disconnects": load.disconnects, "idle": int(idle["running"] == 0 and
                                                                                idle["waiting"] == 0),
              "hits_device": int(hits.get("device", 0)), "hits_kv_ram": int(hits.get("kv_ram", 0)),
              "hits_kv_disk": int(hits.get("kv_disk", 0)), "alive": alive}
    print("BENCH soak " + " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
