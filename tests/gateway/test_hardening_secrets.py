"""The API key: from a 0600 file, the environment, or (with a warning) the command line; never in logs.

Probe of issue #26: ``--api-key KEY`` is visible in the process list.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from ignis.gateway.config import GatewayConfig
from ignis.launcher import serve
from ignis.shared.api_key import keys_of, resolve_api_key
from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway

KEY = "s3cret-key-for-hardening-tests"
CHAT = "/v1/chat/completions"
OK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def key_file(tmp_path, mode: int):
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    path.chmod(mode)
    return path


def check_auth(gw) -> None:
    assert gw.post(CHAT, OK).status == 401
    assert gw.post(CHAT, OK, {"Authorization": "Bearer wrong"}).status == 401
    assert gw.post(CHAT, OK, {"Authorization": f"Bearer {KEY}"}).status == 200
    metrics = http("GET", gw.url + "/metrics").body.decode()
    assert KEY not in metrics and KEY not in gw.log()


def test_a_key_file_of_mode_0600_serves_and_the_key_stays_out_of_logs(tmp_path):
    with fake_gateway(tmp_path, "--api-key-file", str(key_file(tmp_path, 0o600))) as gw:
        check_auth(gw)
        assert "--api-key puts the key" not in gw.log()
        assert KEY not in " ".join(gw.proc.args)


def test_the_environment_serves(tmp_path):
    with fake_gateway(tmp_path, env={"IGNIS_API_KEY": KEY}) as gw:
        check_auth(gw)


def test_the_flag_still_works_and_warns(tmp_path):
    with fake_gateway(tmp_path, "--api-key", KEY) as gw:
        check_auth(gw)
        assert "--api-key puts the key on the command line" in gw.log()


def run_gateway(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0",
                           "--engine-endpoint", "ipc:///nonexistent/e.sock", *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_can_read_is_refused(tmp_path, mode):
    path = key_file(tmp_path, mode)
    r = run_gateway("--api-key-file", str(path))
    assert r.returncode == 2
    assert f"{mode:04o}" in r.stderr and "chmod 600" in r.stderr and KEY not in r.stderr + r.stdout


def test_two_sources_are_refused(tmp_path):
    r = run_gateway("--api-key-file", str(key_file(tmp_path, 0o600)), env={"IGNIS_API_KEY": KEY})
    assert r.returncode == 2 and "one way" in r.stderr and KEY not in r.stderr


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_serve_passes_the_key_file_as_a_path_and_never_the_key():
    args = serve_args("--api-key-file", "/etc/ignis/api-key", "--max-connections", "64",
                      "--allowed-origins", "https://a.example", "--body-read-timeout", "5")
    gateway = next(c for c in serve.CHILDREN if c.name == "gateway")
    argv = serve.child_argv(GatewayConfig, args, gateway.skip)
    assert argv[argv.index("--api-key-file") + 1] == "/etc/ignis/api-key"
    assert argv[argv.index("--max-connections") + 1] == "64"
    assert argv[argv.index("--allowed-origins") + 1] == "https://a.example"
    assert "--api-key" not in argv
    keyed = serve.child_argv(GatewayConfig, serve_args("--api-key", KEY), gateway.skip)
    assert KEY not in keyed


def test_serve_refuses_a_loose_key_file_before_starting_anything(tmp_path):
    path = key_file(tmp_path, 0o644)
    r = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "serve", "--api-key-file", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "chmod 600" in r.stderr and "READY" not in r.stdout


def test_several_keys_are_each_taken(tmp_path):
    # vLLM's --api-key A B; the flag repeated; a file or the variable with one key per line
    other = "second-key-for-hardening-tests"
    for args, env in ((("--api-key", KEY, other), None), (("--api-key", other, "--api-key", KEY), None),
                      ((), {"IGNIS_API_KEY": f"{other}\n{KEY}\n"})):
        with fake_gateway(tmp_path, *args, env=env) as gw:
            check_auth(gw)
            assert gw.post(CHAT, OK, {"Authorization": f"Bearer {other}"}).status == 200
            assert other not in gw.log()


def test_serve_takes_several_keys_and_refuses_an_empty_one():
    assert serve_args("--api-key", "a", "b", "--api-key", "c").api_key == ["a", "b", "c"]
    assert keys_of(resolve_api_key(["a", "b"], None, environ={}, warn=lambda t: None)) == ("a", "b")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(["a", " "], None, environ={}, warn=lambda t: None)


def test_an_empty_host_is_refused():
    # an unset variable in a unit file (--host ${IGNIS_HOST}) would otherwise listen on every interface
    with pytest.raises(ValueError, match="--host is empty"):
        GatewayConfig(host="")
