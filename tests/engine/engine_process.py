"""Test helpers: start a real ``ignis engine`` process and talk to it over ZeroMQ."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from ignis.shared.wire import (
    ENGINE_TO_GATEWAY,
    Abort,
    CacheFlushed,
    Finished,
    FlushCache,
    Generate,
    Refused,
    SamplingParams,
    Stats,
    StatsReply,
    TokenBatch,
)
from ignis.shared.zmq_queues import connect_dealer

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finished: Finished | None = None
    refused: Refused | None = None
    batches: int = 0

    @property
    def done(self) -> bool:
        return self.finished is not None or self.refused is not None


class EngineProcess:
    """An engine child process on a private runtime dir, with one DEALER client."""

    def __init__(self, runtime_dir: Path, *flags: str, model: str | None = None, startup_timeout: float = 120,
                 env: dict | None = None):
        args = [sys.executable, "-m", "ignis.launcher.cli", "engine", "--runtime-dir", str(runtime_dir), *flags]
        if model:
            args += ["--model", model]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.log_path = Path(runtime_dir) / "engine.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        deadline = time.monotonic() + startup_timeout
        self.endpoint = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine exited during start: {self.log_text()}")
            if line.startswith("READY "):
                self.endpoint = line.split()[1]
                break
        if self.endpoint is None:
            self.stop()
            raise RuntimeError("engine did not become ready")
        self.ctx = zmq.Context.instance()
        self.client = connect_dealer(self.ctx, self.endpoint, ENGINE_TO_GATEWAY, name="test").start()
        self.outcomes: dict[str, Outcome] = {}
        self.stats_replies: "queue.Queue[StatsReply]" = queue.Queue()
        self.others: list = []

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def generate(self, rid: str, prompt: list[int], **sampling) -> None:
        self.outcomes[rid] = Outcome()
        extra = {k: sampling.pop(k) for k in ("request_class", "system_end", "opener_start", "grammar", "images",
                                                   "cache_salt") if k in sampling}
        sp = SamplingParams(**{"temperature": 0.0, **sampling})
        self.client.send(Generate(rid, tuple(prompt), sp, **extra))

    def abort(self, rid: str, reason: str = "abort") -> None:
        self.client.send(Abort(rid, reason))

    def pump(self, timeout: float = 0.1) -> None:
        try:
            env = self.client.get(timeout=timeout)
        except queue.Empty:
            return
        msg = env.message
        if isinstance(msg, TokenBatch):
            for s in msg.streams:
                out = self.outcomes[s.id]
                out.tokens.extend(s.token_ids)
                out.batches += 1
        elif isinstance(msg, Finished):
            self.outcomes[msg.id].finished = msg
        elif isinstance(msg, Refused):
            self.outcomes[msg.id].refused = msg
        elif isinstance(msg, StatsReply):
            self.stats_replies.put(msg)
        else:
            self.others.append(msg)

    def wait(self, rids, timeout: float = 120) -> dict[str, Outcome]:
        deadline = time.monotonic() + timeout
        while not all(self.outcomes[r].done for r in rids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests not done: {[r for r in rids if not self.outcomes[r].done]}\n"
                                   f"{self.log_text()}")
            self.pump()
        return {r: self.outcomes[r] for r in rids}

    def run(self, rid: str, prompt: list[int], timeout: float = 120, **sampling) -> Outcome:
        self.generate(rid, prompt, **sampling)
        return self.wait([rid], timeout)[rid]

    def flush_cache(self, fid: str = "flush", timeout: float = 30) -> CacheFlushed:
        """Ask for a cache reset and wait for its answer."""
        self.client.send(FlushCache(fid))
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.others:
                if isinstance(msg, CacheFlushed) and msg.id == fid:
                    self.others.remove(msg)
                    return msg
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to the cache reset\n{self.log_text()}")
            self.pump()

    def stats(self, timeout: float = 10) -> dict:
        self.client.send(Stats())
        deadline = time.monotonic() + timeout
        while self.stats_replies.empty():
            if time.monotonic() > deadline:
                raise TimeoutError("no stats reply")
            self.pump()
        return self.stats_replies.get().values

    def wait_pool_full(self, timeout: float = 10) -> dict:
        """Stats once no request runs and every page is free or held by a retained entry."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            # pages retained for reuse (capture points, checkpoints) are held on purpose, not leaked
            held = s.get("retained_pages_held", 0)
            if s["pool_pages_free"] + held == s["pool_pages_total"] and s["num_requests_running"] == 0:
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"pool not back to full: {s}")
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if hasattr(self, "client"):
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
