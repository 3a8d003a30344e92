"""Test helpers: a real ``ignis tierd`` child process, and a fake engine that exports shm blocks to it.

The fake engine's memory mirrors the real one's layouts, small::

    kv          [L_full=2, 2, P=32, 64, H=2, D=8] fp32  -> runs 4, items 32, item 4096 B (a page: 16 KiB)
    ssm         [L_lin=3, lanes=4, 512 B]               -> runs 3, items 4, item 512 B
    conv        [L_lin=3, lanes=4, 300 B]               -> runs 3, items 4, item 300 B
    host_slots  [images=4, 2436 B]                      -> runs 1, items 4 (one image = ssm + conv of a lane)

All filled with seeded random bytes, so any copy that lands in the wrong
place shows up as a byte mismatch.
"""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import zmq

from ignis.shared.shm_blocks import ShmBlock
from ignis.shared.tier_wire import TIER_PROTOCOL_VERSION, TIERD_TO_ENGINE, Bye, Hello, UnitLayout, Welcome
from ignis.shared.zmq_queues import connect_dealer

ROOT = Path(__file__).resolve().parents[2]
PAGE_BYTES = 4 * 4096
LANE_BYTES = 3 * 512 + 3 * 300
STAMP = "a1b2c3d4/bf16/nodrafter"
TIMEOUT = 10.0


def key(n: int) -> str:
    return hashlib.blake2b(str(n).encode(), digest_size=16).hexdigest()


def entry_blocks(pages: int, lane: bool = True) -> int:
    """Arena blocks (of PAGE_BYTES) an entry of ``pages`` pages (+ a lane) takes."""
    return pages + (1 if lane else 0)


def make_blocks(pages: int = 32, lanes: int = 4, images: int = 4) -> dict[str, ShmBlock]:
    return {
        "kv": ShmBlock.create("kv", runs=4, items=pages, item_bytes=4096, instance="test"),
        "ssm": ShmBlock.create("ssm", runs=3, items=lanes, item_bytes=512, instance="test"),
        "conv": ShmBlock.create("conv", runs=3, items=lanes, item_bytes=300, instance="test"),
        "host_slots": ShmBlock.create("host_slots", runs=1, items=images, item_bytes=LANE_BYTES, instance="test"),
    }


class TierdProcess:
    """``ignis tierd`` on a private runtime dir; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(self, runtime_dir: Path, *flags: str, expect_ready: bool = True, preexec_fn=None,
                 metrics: bool = True, timeout: float = 30.0, env: dict | None = None):
        self.runtime_dir = Path(runtime_dir)
        args = [sys.executable, "-m", "ignis.launcher.cli", "tierd", "--runtime-dir", str(runtime_dir), *flags]
        if metrics:
            args += ["--metrics-port", "0"]
        self.log_path = self.runtime_dir / f"tierd-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     preexec_fn=preexec_fn)
        self.endpoint = None
        self.metrics_port = None
        if not expect_ready:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"tierd exited during start: {self.log_text()}")
            if line.startswith("METRICS "):
                self.metrics_port = int(line.split()[1])
            if line.startswith("READY "):
                self.endpoint = line.split()[1]
                return
        self.proc.kill()
        raise RuntimeError("tierd did not become ready")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def metric(self, name: str, **labels) -> float:
        """One sample of ``/metrics`` (0.0 when absent)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc


class FakeEngine:
    """Shared-memory blocks laid out like the engine's, and a DEALER to tierd."""

    def __init__(self, endpoint: str, seed: int = 0, pages: int = 32, lanes: int = 4, images: int = 4,
                 engine_id: str = "default"):
        self.rng = np.random.default_rng(seed)
        self.engine_id = engine_id
        self.attached = False  # the last hello was welcomed: close() says Bye
        self.blocks = make_blocks(pages, lanes, images)
        self.scramble()
        self.ctx = zmq.Context.instance()
        self.chan = connect_dealer(self.ctx, endpoint, TIERD_TO_ENGINE, name="fake-engine").start()
        self._req = 0
        self._early: dict[int, object] = {}

    # ----- memory --------------------------------------------------------------

    def scramble(self) -> None:
        """Fill every block with fresh random bytes."""
        for b in self.blocks.values():
            b.array()[...] = self.rng.integers(0, 256, size=(b.runs, b.items, b.item_bytes), dtype=np.uint8)

    def read(self, refs) -> bytes:
        """The payload ``refs`` name, item after item (what tierd stores)."""
        return b"".join(self.blocks[b].item(i).tobytes() for b, i in refs)

    def snapshot(self) -> dict[str, bytes]:
        return {name: bytes(b.buf) for name, b in self.blocks.items()}

    def hello(self, stamp: str = STAMP, family: str = "qwen3_next", protocol: int = TIER_PROTOCOL_VERSION,
              **overrides):
        fields = dict(req=self.next_req(), protocol=protocol, stamp=stamp, family=family, block_bytes=PAGE_BYTES,
                      blocks=tuple(b.descriptor() for b in self.blocks.values()), unit=UnitLayout(),
                      engine_id=self.engine_id)
        fields.update(overrides)
        reply = self.ask(Hello(**fields))
        self.attached = isinstance(reply, Welcome) or self.attached
        return reply

    # ----- messages ------------------------------------------------------------

    def next_req(self) -> int:
        self._req += 1
        return self._req

    def send(self, msg) -> int:
        self.chan.send(msg)
        return msg.req

    def wait_for(self, req: int, timeout: float = TIMEOUT):
        if req in self._early:
            return self._early.pop(req)
        deadline = time.monotonic() + timeout
        while True:
            try:
                env = self.chan.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no reply to request {req} within {timeout} s") from None
            got = getattr(env.message, "req", None)
            if got == req:
                return env.message
            self._early[got] = env.message

    def ask(self, msg, timeout: float = TIMEOUT):
        return self.wait_for(self.send(msg), timeout)

    def close(self) -> None:
        """Detach from tierd (its entries are dropped) and free the exported memory."""
        if self.attached:
            try:
                self.ask(Bye(self.next_req()), timeout=2.0)
            except TimeoutError:
                pass  # tierd is gone: nothing of ours to drop there
        self.chan.close()
        for b in self.blocks.values():
            b.close()


def unlocked_memlock_preexec(limit: int):
    """A preexec_fn: RLIMIT_MEMLOCK = ``limit`` and, as root, no CAP_IPC_LOCK (which ignores the limit)."""
    import ctypes
    import resource

    def fn():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(24, 14, 0, 0, 0)  # PR_CAPBSET_DROP, CAP_IPC_LOCK; fails harmlessly when not root

    return fn

