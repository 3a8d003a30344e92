"""The units' own command lines, run as plain processes, wire the engine to tierd and survive its restart.

Each ``ExecStart`` is taken from its unit file and expanded with
``ignis.env.example`` (the model replaced by the demo, the runtime dir by a
temporary one, the arena shrunk to fit this machine's memlock limit, the
device the CPU, metrics ports free ones, /var/cache/ignis a temporary dir), then started as systemd would:
tierd, then the engine once tierd is READY, then the gateway. A
conversation must resume from KV-RAM. Then tierd is killed with requests in
flight: they complete, the engine keeps serving, and once tierd is started
again from the same line (what ``Restart=on-failure`` does) the engine says
hello again and conversations resume from KV-RAM with their cold outputs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from ignis.shared.demo import ensure_demo_model
from tests.deploy.unit_commands import ENV_EXAMPLE, read_env_file, unit_argv
from tests.launcher.conversations import (
    CONVERSATIONS,
    SMALL_ENGINE,
    ask,
    content,
    resume_from_kv_ram,
    shm_names,
    wait_for,
)

ARENA = 4 << 20  # under the 8 MiB RLIMIT_MEMLOCK of an unprivileged test; the unit sets LimitMEMLOCK=infinity


def replaced(value: str, old: str, new: str) -> str:
    assert old in value, f"ignis.env.example changed: {old!r} not in {value!r}"
    return value.replace(old, new)


def units_env() -> dict[str, str]:
    env = read_env_file(ENV_EXAMPLE)
    env["IGNIS_MODEL"] = str(ensure_demo_model())
    env["IGNIS_PORT"] = "0"
    env["IGNIS_TIERD_ARGS"] = replaced(replaced(env["IGNIS_TIERD_ARGS"], "--reuse-kv-host-pool-bytes 2G",
                                                f"--reuse-kv-host-pool-bytes {ARENA}"), "9102", "0")
    engine = replaced(replaced(env["IGNIS_ENGINE_ARGS"], "--device cuda", "--device cpu"), "9101", "0")
    env["IGNIS_ENGINE_ARGS"] = replaced(engine, "--decode-lanes 16", " ".join(SMALL_ENGINE))
    return env


class UnitProcess:
    """One unit's ExecStart as a child; its READY (and METRICS) lines read from its stdout file."""

    def __init__(self, unit: str, argv: list[str], tmp: Path, n: int = 0):
        self.unit = unit
        self.out, self.err = tmp / f"{unit}.{n}.out", tmp / f"{unit}.{n}.err"
        self.proc = subprocess.Popen(argv, stdout=self.out.open("w"), stderr=self.err.open("w"),
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.ready = wait_for(f"{unit} READY", self._ready, 120, self.log)
        m = re.search(r"^METRICS (\d+)$", self.out.read_text(), re.M)
        self.metrics = f"http://127.0.0.1:{m.group(1)}/metrics" if m else None

    def _ready(self):
        if m := re.search(r"^READY (\S+)$", self.out.read_text(), re.M):
            return m.group(1)
        assert self.proc.poll() is None, f"{self.unit} exited with {self.proc.returncode}:\n{self.log()}"
        return None

    def log(self) -> str:
        return self.out.read_text() + self.err.read_text(errors="replace")[-6000:]

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


class Units:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        env = units_env()
        rewrite = {"/usr/local/bin/ignis": [sys.executable, "-m", "ignis.launcher.cli"],
                   "/run/ignis": [str(tmp / "run")], "/var/cache/ignis/": [str(tmp / "cache")]}
        self.argv = {u: unit_argv(f"ignis-{u}.service", env, rewrite) for u in ("tierd", "engine", "gateway")}
        self.tierd = UnitProcess("tierd", self.argv["tierd"], tmp)
        self.engine = UnitProcess("engine", self.argv["engine"], tmp)
        self.gateway = UnitProcess("gateway", self.argv["gateway"], tmp)
        self.url = self.gateway.ready
        with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as resp:
            self.model = json.loads(resp.read())["data"][0]["id"]
        self.cold: dict[int, str] = {}

    def log(self) -> str:
        return "\n".join(f"--- {p.unit}\n{p.log()}" for p in (self.tierd, self.engine, self.gateway))


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("units")
    (tmp / "run").mkdir(mode=0o700)  # RuntimeDirectory=ignis
    (tmp / "cache").mkdir(mode=0o700)  # CacheDirectory=ignis (the tierd unit's KV-disk)
    started = Units(tmp)
    yield started
    codes = {p.unit: p.stop() for p in (started.gateway, started.engine, started.tierd)}
    assert codes == {"gateway": 0, "engine": 0, "tierd": 0}, started.log()


def test_the_engine_unit_is_wired_to_tierd_and_resumes_from_kv_ram(units):
    assert "--tierd-endpoint" in units.argv["engine"]
    assert units.tierd.ready == f"ipc://{units.tmp / 'run'}/default-tierd.sock"
    assert units.tierd.metric("ignis:tierd_arena_locked_bytes") == ARENA  # --require-mlock on: locked whole
    assert "tierd connected" in units.engine.log()
    assert f"KV-disk {units.tmp / 'cache'}/default-kv-disk " in units.tierd.log()  # the unit's --kv-disk-dir
    units.cold.update({i: content(ask(units.url, units.model, i)) for i in range(CONVERSATIONS)})
    done = resume_from_kv_ram(units.url, units.model, units.engine.err, units.cold)
    assert 0 < done["cached_tokens"] < done["prompt_tokens"]
    assert units.tierd.metric("ignis:tierd_restores_total") >= 1


def test_a_tierd_killed_with_requests_in_flight_is_a_cache_miss_and_the_engine_reconnects(units):
    if not units.cold:
        pytest.skip("needs the cold answers of the test above")
    engine_pid = units.engine.proc.pid
    shm = shm_names(engine_pid)
    replies, failures = [], []

    def in_flight(i):
        try:
            replies.append(ask(units.url, units.model, i, max_tokens=40))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=in_flight, args=(i,)) for i in range(CONVERSATIONS)]
    for t in threads:
        t.start()
    wait_for("requests in flight", lambda: units.engine.metric("ignis:num_requests_running") >= 1 or failures,
             30, units.log)
    units.tierd.proc.kill()
    assert units.tierd.proc.wait(10) == -signal.SIGKILL
    for t in threads:
        t.join(60)
    assert not failures and [r["usage"]["completion_tokens"] for r in replies] == [40] * CONVERSATIONS
    # tierd is away: the engine keeps serving (from the device alone, a miss below) and notices
    def serving_without_tierd():
        assert content(ask(units.url, units.model, 0)) == units.cold[0]
        return units.engine.metric("ignis:tierd_connected") == 0

    wait_for("the engine to notice", serving_without_tierd, 30, units.log)

    connects = units.engine.log().count("tierd connected")
    units.tierd = UnitProcess("tierd", units.argv["tierd"], units.tmp, n=1)  # Restart=on-failure
    wait_for("the engine to say hello again", lambda: units.engine.log().count("tierd connected") > connects,
             30, units.log)
    resume_from_kv_ram(units.url, units.model, units.engine.err, units.cold)
    assert units.tierd.metric("ignis:tierd_restores_total") >= 1  # the new tierd's
    assert units.engine.proc.poll() is None and shm_names(engine_pid) == shm
