"""Fixtures of the gateway tests: the demo tokenizer, and one `ignis serve` for the whole session.

``server`` starts ``ignis serve`` on the demo model on a free port, with a
temporary runtime dir and an API key, and stops it (SIGTERM, exit code 0) at
the end of the session. Its output goes to files under the session's tmp dir
(read ``server.log()`` when a test fails).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from ignis.shared.demo import ensure_demo_model
from ignis.gateway.tokenizer import load_model_files

API_KEY = "test-key-123"
START_TIMEOUT = 120


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    return Path(ensure_demo_model())


@pytest.fixture(scope="session")
def demo_files(demo_dir):
    return load_model_files(demo_dir)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_files):
    return demo_files.tokenizer


@dataclass
class Server:
    url: str
    engine_endpoint: str
    api_key: str
    model: str
    proc: subprocess.Popen
    out: Path
    err: Path

    def log(self) -> str:
        return self.out.read_text() + "\n" + self.err.read_text()[-6000:]


def start_serve(tmp: Path, extra: list[str], env: dict | None = None) -> Server:
    runtime = Path(f"/tmp/ignis-gwt-{os.getpid()}-{tmp.name[-8:]}")
    out, err = tmp / "serve.out", tmp / "serve.err"
    argv = [sys.executable, "-m", "ignis.launcher.cli", "serve", "--port", "0", "--runtime-dir", str(runtime),
            "--instance", "gwtest", "--reuse-kv-host-pool-bytes", "64M", *extra]
    proc = subprocess.Popen(argv, stdout=out.open("w"), stderr=err.open("w"), stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = out.read_text()
        m = re.search(r"^ignis serving (\S+) on (https?://\S+)$", text, re.M)
        if m:
            endpoint = re.search(r"^READY (ipc://\S+-engine\.sock)$", text, re.M).group(1)
            return Server(m.group(2), endpoint, API_KEY, m.group(1), proc, out, err)
        if proc.poll() is not None:
            raise RuntimeError(f"ignis serve exited with {proc.returncode}:\n{text}\n{err.read_text()[-4000:]}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"ignis serve did not become ready:\n{out.read_text()}\n{err.read_text()[-4000:]}")


def stop_serve(server: Server) -> int:
    """SIGTERM, then the exit code (-9: it had to be killed after four minutes, longer than serve's own
    --stop-timeout for both its stages, so a child that ignores SIGTERM shows up in the log as killed)."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(240)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        return -9


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    s = start_serve(tmp, ["--kv-pool-tokens", "16384", "--decode-lanes", "16", "--api-key", API_KEY])
    yield s
    code = stop_serve(s)
    assert code == 0, s.log()


@pytest.fixture
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key=server.api_key, max_retries=0, timeout=60) as c:
        yield c


@dataclass
class Reply:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 30) -> Reply:
    """One plain HTTP request (urllib), any status returned rather than raised."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, dict(e.headers), e.read())
