"""Abuse probes against a live ``ignis serve`` (demo model unless --model), no API key, default gateway flags.

    big body    two 10 MB chat bodies at once, sent with Content-Length, then two more sent chunked;
                the slowest answer (seconds; each must be a 4xx) while /health is polled without pause
                (its slowest answer, ms) and the gateway's peak RSS growth (VmHWM - VmRSS before, MB)
    deep tool   a tool whose parameters nest ~1,010 levels: must be a 4xx
    text/plain  a POST with Content-Type text/plain: must be a 415
    half-sent   N connections that send headers and 1 byte of a 1,000-byte body, then nothing:
                seconds until the server has closed all of them, and the slowest normal chat request
                meanwhile
    after       the engine still answers (engine_alive=1), and the greedy requests made before the
                probes, made again, give identical text (wrong_answers counts those that differ)

The last line is

    BENCH abuse big_body_s=A health_max_ms=B rss_growth_mb=C halfsent_closed_s=D engine_alive=E wrong_answers=F

with goals A <= 1, B <= 100, C <= 200, D <= 30, E = 1, F = 0. A probe whose
answer has the wrong status is printed as FAIL and the script exits 1.

    python bench/abuse.py [--model DIR] [--halfsent N] [--quick]

``--quick`` (the test suite's run): three greedy prompts, and the gateway's
body deadline at 3 s, so the half-sent probe does not wait out the default
15 s (the other flags stay the defaults).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from checkout import use_checkout  # noqa: E402
from serve_process import children, start_serve, stop_serve  # noqa: E402

use_checkout()

CHAT = "/v1/chat/completions"
TEN_MB = 10 << 20
PROMPTS = ("Count from one to five.", "Name a color.", "Say hello to the moon.", "What is two plus two?",
           "Write one word about the sea.")


def gateway_pid(serve_pid: int) -> int:
    pid = children(serve_pid).get("gateway")
    if pid is None:
        raise SystemExit("no gateway child found")
    return pid


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for {pid}")


def post(url: str, body: bytes, ctype: str = "application/json", timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def greedy(url: str, prompt: str) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0}
    status, raw = post(url + CHAT, json.dumps(body).encode())
    if status != 200:
        return f"<HTTP {status}>"
    return json.loads(raw)["choices"][0]["message"]["content"] or ""


def read_status(sock: socket.socket, timeout: float) -> int:
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return 0
            data += chunk
    except OSError:
        return 0
    return int(data.split(b" ", 2)[1])


def closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


class HealthWatch:
    """Polls GET /health back to back on its own thread; ``worst`` is the slowest answer in seconds."""

    def __init__(self, url: str):
        self.url = url + "/health"
        self.worst = 0.0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as resp:
                    ok = resp.status == 200
            except (urllib.error.URLError, OSError):
                ok = False
            self.worst = max(self.worst, time.monotonic() - t)
            self.failures += not ok

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(15)


def big_bodies(host: str, port: int, chunked: bool) -> list[tuple[int, float]]:
    head = b'{"max_tokens": 2, "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    body = head + b"x" * (TEN_MB - len(head) - len(tail)) + tail
    results: list[tuple[int, float]] = []

    def send():
        sock = socket.create_connection((host, port), timeout=30)
        started = time.monotonic()
        try:
            if chunked:
                sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n".encode())
                for at in range(0, len(body), 1 << 20):
                    piece = body[at:at + (1 << 20)]
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            else:
                sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except OSError:
            pass  # answered before the body was all sent: the status is there to read
        results.append((read_status(sock, 30), time.monotonic() - started))
        sock.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def deep_tool_status(url: str) -> int:
    pairs = 505
    schema = '{"type": "object", "properties": {"a": ' * pairs + '{"type": "string"}' + "}}" * pairs
    raw = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": "function", '
           '"function": {"name": "f", "parameters": ' + schema + "}}]}")
    return post(url + CHAT, raw.encode())[0]


def half_sent(url: str, host: str, port: int, n: int) -> tuple[float, list[float]]:
    """(seconds until the server has closed all n, the times of normal requests made meanwhile)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 1000\r\n\r\n{".encode())
        socks.append(s)
    started = time.monotonic()
    times: list[float] = []
    done = threading.Event()

    def normal_requests():  # beside the polling below, so the close times are not rounded up to a request
        while not done.is_set():
            times.append(timed_greedy(url))

    worker = threading.Thread(target=normal_requests, daemon=True)
    worker.start()
    open_ = list(socks)
    while open_ and time.monotonic() - started < 120:
        open_ = [s for s in open_ if not closed(s)]
        time.sleep(0.05)
    took = time.monotonic() - started if not open_ else float("inf")
    done.set()
    worker.join(120)
    for s in socks:
        s.close()
    return took, times


def timed_greedy(url: str) -> float:
    t = time.monotonic()
    greedy(url, PROMPTS[1])
    return time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--halfsent", type=int, default=200, help="half-sent connections")
    ap.add_argument("--quick", action="store_true",
                    help="three greedy prompts instead of five; --body-read-timeout 3 (the half-sent probe "
                         "waits out the body deadline, 15 s by default)")
    args = ap.parse_args()
    prompts = PROMPTS[:3] if args.quick else PROMPTS
    flags = ["--reuse-kv-host-pool-bytes", "64M"] + (["--body-read-timeout", "3"] if args.quick else [])
    runtime = tempfile.mkdtemp(prefix="ignis-abuse-")
    proc, url, log = start_serve(runtime, "abuse", flags, args.model)
    failed = []
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        gw = gateway_pid(proc.pid)
        before = [greedy(url, p) for p in prompts]
        rss_before = rss_kb(gw, "VmRSS")
        with HealthWatch(url) as health:
            sized = big_bodies(host, port, chunked=False)
            chunked = big_bodies(host, port, chunked=True)
            deep = deep_tool_status(url)
            plain = post(url + CHAT, json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
                         ctype="text/plain")[0]
        rss_growth_mb = (rss_kb(gw, "VmHWM") - rss_before) / 1024
        bodies = sized + chunked
        print(f"big bodies      statuses {[s for s, _ in bodies]} seconds {[round(t, 3) for _, t in bodies]}")
        print(f"health          slowest {health.worst * 1e3:.1f} ms, failures {health.failures}")
        print(f"deep tool       HTTP {deep}")
        print(f"text/plain      HTTP {plain}")
        if not all(400 <= s < 500 for s, _ in bodies):
            failed.append("big body not answered 4xx")
        if not 400 <= deep < 500:
            failed.append(f"deep tool schema answered {deep}")
        if plain != 415:
            failed.append(f"text/plain answered {plain}")
        if health.failures:
            failed.append(f"/health failed {health.failures} times")
        usual = sorted(timed_greedy(url) for _ in range(5))
        took, during = half_sent(url, host, port, args.halfsent)
        print(f"half-sent       {args.halfsent} closed after {took:.1f} s; chat requests before: median "
              f"{usual[2]:.3f} s, max {usual[-1]:.3f} s; meanwhile ({len(during)}): median "
              f"{sorted(during)[len(during) // 2]:.3f} s, max {max(during):.3f} s")
        after = [greedy(url, p) for p in prompts]
        alive = int(all(not a.startswith("<HTTP") for a in after))
        wrong = sum(a != b for a, b in zip(before, after))
        for p, a, b in zip(prompts, before, after):
            print(f"greedy          {p!r}: {'same' if a == b else f'{a!r} -> {b!r}'}")
    finally:
        stop_serve(proc)
    for f in failed:
        print(f"FAIL {f}")
    big_s = max(t for _, t in bodies)
    print(f"BENCH abuse big_body_s={big_s:.3f} health_max_ms={health.worst * 1e3:.1f} "
          f"rss_growth_mb={rss_growth_mb:.1f} halfsent_closed_s={took:.1f} engine_alive={alive} wrong_answers={wrong}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
