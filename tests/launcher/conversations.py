"""Conversations that land in KV-RAM, for the tests that kill and restart tierd under a running service.

With ``SMALL_ENGINE`` (two lanes, one host slot per lane) three conversations
asked in turn push each other's checkpoints down to tierd, and asking one
again resumes it from KV-RAM. ``ask`` is one greedy chat completion over
plain HTTP; ``done_lines`` reads the engine's per-request done lines from a
log; ``wait_for`` polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.gateway.test_reuse_http import text

SMALL_ENGINE = ["--kv-pool-tokens", "1024", "--decode-lanes", "2", "--reuse-host-slots-per-lane", "1",
                "--restore-floor-kv-ram", "64", "--tierd-timeout", "2", "--tierd-retry-interval", "0.5"]
"""Engine flags: a pool and slots small enough that three conversations reach KV-RAM; a lost tierd
is noticed within 2 s and asked again every 0.5 s."""
CONVERSATIONS = 3


def ask(url: str, model: str, i: int, max_tokens: int = 8, timeout: float = 60) -> dict:
    """Conversation ``i`` (its own 200-word system prompt), greedy; the response's JSON."""
    body = json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0, "messages": [
        {"role": "system", "content": f"You are agent {i}. " + text(200, 10 + i)},
        {"role": "user", "content": "what next?"}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def content(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def done_lines(log: Path) -> list[dict]:
    """The engine's done lines in ``log``, in order."""
    return [json.loads(line[line.index("{"):]) for line in log.read_text(errors="replace").splitlines()
            if '"event":"done"' in line]


def wait_for(what: str, condition, timeout: float, explain=lambda: ""):
    """Poll ``condition()`` until it returns something truthy (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{explain()}")
        time.sleep(0.05)  # a poll interval, not a wait for a state


def shm_names(pid: int) -> set[str]:
    """The POSIX shared memory objects the engine with ``pid`` created."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"ignis-{pid}-")}


def resume_from_kv_ram(url: str, model: str, log: Path, cold: dict[int, str], timeout: float = 30) -> dict:
    """Ask the conversations in turn until one resumes from KV-RAM; every answer must be its cold one.
    Returns that request's done line."""
    start = len(done_lines(log))
    rounds = 0

    def one_round():
        nonlocal rounds
        rounds += 1
        for i in range(CONVERSATIONS):
            assert content(ask(url, model, i)) == cold[i], f"conversation {i} differs from its cold answer"
        return next((d for d in done_lines(log)[start:] if d["tier"] == "kv_ram"), None)

    return wait_for("a request resumed from KV-RAM", one_round, timeout,
                    lambda: f"{rounds} rounds; tiers {[d['tier'] for d in done_lines(log)[start:]]}")


def stop_serve(proc: subprocess.Popen) -> int:
    """SIGTERM to ``ignis serve`` and its exit code (-9 when it had to be killed after 60 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9
