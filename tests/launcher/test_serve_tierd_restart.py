"""`ignis serve` keeps serving through a tierd killed with requests in flight, and starts tierd again.

The gateway and the engine stay up, every request in flight completes, serve
logs the death and the restart, the engine says hello to the new tierd and
resumes conversations from KV-RAM again with their cold outputs; the
engine's shared memory is neither leaked nor lost across the restart and is
gone once serve stops.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.launcher.conversations import (
    CONVERSATIONS,
    SMALL_ENGINE,
    ask,
    content,
    resume_from_kv_ram,
    shm_names,
    stop_serve,
    wait_for,
)


def children(pid: int) -> dict[str, int]:
    """serve's children by subcommand."""
    out = {}
    for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
        out[argv[argv.index(b"ignis.launcher.cli") + 1].decode()] = int(kid)
    return out


def running(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ignis:num_requests_running{"))


@pytest.mark.timeout(120)
def test_a_killed_tierd_is_started_again_and_the_service_keeps_serving(tmp_path):
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path / "rt"),
                             "--port", "0", "--reuse-kv-host-pool-bytes", "4M", "--metrics-port", "0",
                             "--tierd-metrics-port", "0", *SMALL_ENGINE],
                            stdout=out.open("w"), stderr=err.open("w"), stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log = lambda: out.read_text() + err.read_text()[-6000:]  # noqa: E731
    try:
        m = wait_for("serve ready", lambda: proc.poll() is None and re.search(
            r"^ignis serving (\S+) on (http://\S+)$", out.read_text(), re.M) or (proc.poll() is not None and "exit"),
            120, log)
        assert m != "exit", log()
        model, url = m.group(1), m.group(2)
        kids = children(proc.pid)
        shm = shm_names(kids["engine"])
        assert shm, "the engine shares its pool and slots with tierd through /dev/shm"
        cold = {i: content(ask(url, model, i)) for i in range(CONVERSATIONS)}
        assert resume_from_kv_ram(url, model, err, cold)["cached_tokens"] > 0

        replies, failures = [], []

        def in_flight(i):
            try:
                replies.append(ask(url, model, i, max_tokens=40))
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)

        threads = [threading.Thread(target=in_flight, args=(i,)) for i in range(CONVERSATIONS)]
        for t in threads:
            t.start()
        metrics = re.search(r"^ignis serve: engine metrics on (\S+)$", out.read_text(), re.M).group(1)
        wait_for("requests in flight", lambda: running(metrics) >= 1 or failures, 30, log)
        connects = err.read_text().count("tierd connected")
        os.kill(kids["tierd"], signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert not failures and len(replies) == CONVERSATIONS, failures
        assert all(r["usage"]["completion_tokens"] == 40 for r in replies)

        wait_for("tierd restarted", lambda: "the tierd is back after restart 1" in err.read_text(), 30, log)
        text = err.read_text()
        assert "the tierd exited with code -9 while serving" in text
        assert "starting the tierd again in 0.5 s (restart 1); the others keep serving" in text
        # a new tierd took a new free port for its metrics (--tierd-metrics-port 0): serve says where
        moved = re.search(r"the tierd is back after restart 1; its metrics now on (\S+)$", text, re.M)
        assert moved, text[-3000:]
        assert "ignis:" in urllib.request.urlopen(moved.group(1), timeout=10).read().decode()
        now = children(proc.pid)
        assert proc.poll() is None and now["engine"] == kids["engine"] and now["gateway"] == kids["gateway"]
        assert now["tierd"] != kids["tierd"]
        # the engine says hello to the new tierd and conversations resume from KV-RAM again, exactly
        resume_from_kv_ram(url, model, err, cold)
        assert err.read_text().count("tierd connected") > connects  # the hello to the new tierd
        assert shm_names(kids["engine"]) == shm  # nothing lost, nothing left by the dead tierd
    finally:
        code = stop_serve(proc)
    assert code == 0, log()
    assert not shm_names(kids["engine"])
