"""An idle unload gives tierd's arena back (unlocked, unmapped); the next request's load takes it again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.launcher.conversations import ask, content, stop_serve, wait_for

ARENA = 4 << 20


def tierd_metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.timeout(120)
def test_idle_unload_releases_the_arena_and_the_next_load_locks_it_again(tmp_path):
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path / "rt"),
                             "--port", "0", "--reuse-kv-host-pool-bytes", str(ARENA), "--kv-pool-tokens", "1024",
                             "--decode-lanes", "2", "--idle-unload-s", "4", "--tierd-metrics-port", "0",
                             "--metrics-port", "0"],
                            stdout=out.open("w"), stderr=err.open("w"), stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log = lambda: out.read_text() + err.read_text()[-6000:]  # noqa: E731
    try:
        m = wait_for("serve ready", lambda: re.search(r"^ignis serving (\S+) on (http://\S+)$", out.read_text(), re.M)
                     or proc.poll() is not None, 120, log)
        assert m is not True, log()
        model, url = m.group(1), m.group(2)
        tierd = re.search(r"^ignis serve: tierd metrics on (\S+)$", out.read_text(), re.M).group(1)
        engine = re.search(r"^ignis serve: engine metrics on (\S+)$", out.read_text(), re.M).group(1)
        first = content(ask(url, model, 0))  # loads the model if it was unloaded already
        assert tierd_metric(tierd, "ignis:tierd_arena_locked_bytes") == ARENA  # well within the 4 s idle
        assert tierd_metric(engine, "ignis:retained_entries") >= 1 and tierd_metric(engine, "ignis:tierd_connected")

        def released():
            return (tierd_metric(tierd, "ignis:tierd_arena_mapped_bytes") == 0
                    and tierd_metric(tierd, "ignis:tierd_arena_locked_bytes") == 0)

        wait_for("the arena released after the idle unload", released, 30, log)
        logged = lambda: "unloaded model" in err.read_text() and "arena released" in err.read_text()  # noqa: E731
        wait_for("the logs of both", logged, 10, log)  # the engine logs its unload after tierd answered its bye
        assert tierd_metric(tierd, "ignis:tierd_arena_bytes") == ARENA  # the configured size, kept for the next load
        # the engine's gauges say what it holds now: nothing (they kept the last turn's values)
        wait_for("the engine's gauges to empty", lambda: tierd_metric(engine, "ignis:kv_pool_pages_free") > 0 and all(
            tierd_metric(engine, name) == 0 for name in ("ignis:kv_pool_pages_used", "ignis:kv_cache_usage_perc",
                                                         "ignis:retained_entries", "ignis:retained_pages",
                                                         "ignis:tierd_connected")), 10, log)

        assert content(ask(url, model, 0)) == first  # loads the model again: the engine says hello
        assert tierd_metric(tierd, "ignis:tierd_arena_mapped_bytes") == ARENA
        assert tierd_metric(tierd, "ignis:tierd_arena_locked_bytes") == ARENA
        assert "arena mapped again" in err.read_text()
    finally:
        code = stop_serve(proc)
    assert code == 0, log()
