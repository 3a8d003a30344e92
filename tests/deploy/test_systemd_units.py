"""The systemd units verify, and say what operators rely on."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SERVICES = ("ignis-tierd.service", "ignis-engine.service", "ignis-gateway.service")


def parse(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read(UNITS / name)
    return cp


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_verify(tmp_path):
    ignis = Path(sys.executable).parent / "ignis"
    for unit in UNITS.iterdir():
        text = unit.read_text().replace("/usr/local/bin/ignis", str(ignis))
        (tmp_path / unit.name).write_text(text)
    names = [str(tmp_path / u.name) for u in UNITS.iterdir()]
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_every_service_notifies_restarts_and_reads_the_env_file():
    for name in SERVICES:
        svc = parse(name)["Service"]
        assert svc["Type"] == "notify"
        assert svc["Restart"] == "on-failure"
        assert svc["EnvironmentFile"].lstrip("-") == "/etc/ignis/ignis.env"
        assert svc["RuntimeDirectory"] == "ignis" and svc["RuntimeDirectoryMode"] == "0700"
        assert svc["RuntimeDirectoryPreserve"] == "yes"  # no unit's stop removes the others' sockets
        assert "WatchdogSec" in svc


def test_memlock_and_ordering():
    assert parse("ignis-tierd.service")["Service"]["LimitMEMLOCK"] == "infinity"
    engine = parse("ignis-engine.service")
    assert engine["Service"]["LimitMEMLOCK"] == "infinity"
    assert "ignis-tierd.service" in engine["Unit"]["Wants"]
    assert "ignis-tierd.service" in engine["Unit"]["After"]
    assert "Requires" not in engine["Unit"]  # a lost tierd is a miss, not an outage
    assert "ignis-engine.service" in parse("ignis-gateway.service")["Unit"]["After"]


DROPIN = ROOT / "deploy" / "dropins" / "ignis-gateway.service.d" / "api-key.conf"


def test_the_gateway_key_comes_from_a_credential_or_the_env_file_never_the_command_line():
    gateway = parse("ignis-gateway.service")["Service"]
    assert "--api-key " not in gateway["ExecStart"] and "--api-key=" not in gateway["ExecStart"]
    assert "$IGNIS_API_KEY_ARGS" in gateway["ExecStart"].split()
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read(DROPIN)
    assert cp["Service"]["LoadCredential"] == "api-key:/etc/ignis/api-key"
    assert cp["Service"]["Environment"] == "IGNIS_API_KEY_ARGS=--api-key-file=%d/api-key"
    env = (ROOT / "deploy" / "ignis.env.example").read_text()
    settings = [line for line in env.splitlines() if not line.startswith("#")]
    assert not any("--api-key" in line for line in settings) and "0600" in env


def test_the_engine_unit_connects_to_the_tierd_unit_of_its_instance():
    from tests.deploy.unit_commands import ENV_EXAMPLE, expand, read_env_file

    env = read_env_file(ENV_EXAMPLE)
    tierd = expand(parse("ignis-tierd.service")["Service"]["ExecStart"], env)
    engine = expand(parse("ignis-engine.service")["Service"]["ExecStart"], env)
    assert engine[engine.index("--tierd-endpoint") + 1] == "auto"  # RUNTIME_DIR/INSTANCE-tierd.sock
    for flag in ("--runtime-dir", "--instance"):  # the socket tierd binds is the one the engine looks for
        assert tierd[tierd.index(flag) + 1] == engine[engine.index(flag) + 1]
    assert "--endpoint" not in tierd and "--tierd-endpoint" not in env["IGNIS_ENGINE_ARGS"]
    assert "ignis-engine.service" in parse("ignis-tierd.service")["Unit"]["Before"]
    wants = parse("ignis.target")["Unit"]["Wants"].split()
    assert sorted(wants) == sorted(SERVICES)
