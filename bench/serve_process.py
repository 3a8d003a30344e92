"""``ignis serve`` as a child of a bench: started on a runtime directory, its URL read, its children found.

    proc, url, log = start_serve(runtime, "soak", ["--kv-pool-tokens", "12288"], model=None)
    children(proc.pid)   # {"tierd": pid, "engine": pid, "gateway": pid}

The serve process leads its own session, so ``stop_serve`` stops the whole tree
(SIGTERM to the process group, SIGKILL past a timeout).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from checkout import ROOT

PROCESSES = ("tierd", "engine", "gateway")


def start_serve(runtime: str, instance: str, flags: list[str], model: str | None = None,
                timeout: float = 300) -> tuple[subprocess.Popen, str, Path]:
    """``ignis serve --port 0`` with ``flags`` (on the demo model unless ``model``); its URL once it serves."""
    log = Path(runtime) / "serve.log"
    argv = [sys.executable, "-m", "ignis.launcher.cli", "serve", "--port", "0", "--runtime-dir", runtime,
            "--instance", instance, *flags]
    if model:
        argv += ["--model", model]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        m = re.match(r"ignis serving \S+ on (http://\S+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its stdout pipe drained
            return proc, m.group(1), log
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"ignis serve did not start:\n{log.read_text()[-3000:]}")


def stop_serve(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM to the whole serve tree; SIGKILL past ``timeout`` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def children(serve_pid: int) -> dict[str, int]:
    """The pid of each process ``ignis serve`` started, by its subcommand."""
    found = {}
    for task in Path(f"/proc/{serve_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            for name in PROCESSES:
                if name.encode() in argv:
                    found[name] = int(pid)
    return found
