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
    assert sorted(wants) == sorted([*SERVICES, "network-online.target"])


# --- the review's fixes: KV-disk on disk, metrics ports, network ordering, defaults, mlock exit, sandbox, key


def test_kv_disk_is_on_real_disk_in_the_units_cache_directory():
    from tests.deploy.unit_commands import ENV_EXAMPLE, expand, read_env_file, unit_environment, values

    tierd = parse("ignis-tierd.service")["Service"]
    argv = expand(tierd["ExecStart"], unit_environment("ignis-tierd.service", read_env_file(ENV_EXAMPLE)))
    assert argv.count("--kv-disk-dir") == 1  # the unit's; the env example does not override it
    disk = Path(argv[argv.index("--kv-disk-dir") + 1])
    run = Path(argv[argv.index("--runtime-dir") + 1])
    assert run == Path("/run/ignis") and not disk.is_relative_to("/run") and not disk.is_relative_to("/tmp")
    # under the CacheDirectory= systemd creates for ignis (and ProtectSystem leaves writable), per instance
    assert values("ignis-tierd.service", "CacheDirectory") == ["ignis"]
    assert disk.parent == Path("/var/cache/ignis") and disk.name == "default-kv-disk"
    assert "${IGNIS_INSTANCE}" in tierd["ExecStart"]
    # tierd removes the directory at exit: it must be a subdirectory, never the cache directory itself
    assert disk != Path("/var/cache/ignis")
    # the flag comes before $IGNIS_TIERD_ARGS, so an operator's --kv-disk-dir there wins (argparse: last)
    line = tierd["ExecStart"].split()
    assert line.index("--kv-disk-dir") < line.index("$IGNIS_TIERD_ARGS")


def test_an_operators_kv_disk_dir_in_the_env_file_wins():
    import argparse

    from ignis.shared.flags import add_flags, from_args
    from ignis.tierd.config import TierdConfig
    from tests.deploy.unit_commands import expand, read_env_file, unit_environment

    env = dict(read_env_file(ROOT / "deploy" / "ignis.env.example"))
    env["IGNIS_TIERD_ARGS"] += " --kv-disk-dir /srv/kv"
    argv = expand(parse("ignis-tierd.service")["Service"]["ExecStart"], unit_environment("ignis-tierd.service", env))

    parser = argparse.ArgumentParser()
    add_flags(parser, TierdConfig)
    assert from_args(TierdConfig, parser.parse_args(argv[argv.index("tierd") + 1:])).kv_disk_dir == "/srv/kv"


def _metrics_ports() -> dict[str, int]:
    from tests.deploy.unit_commands import ENV_EXAMPLE, read_env_file

    env = read_env_file(ENV_EXAMPLE)
    ports = {}
    for role, var in (("engine", "IGNIS_ENGINE_ARGS"), ("tierd", "IGNIS_TIERD_ARGS")):
        args = env[var].split()
        ports[role] = int(args[args.index("--metrics-port") + 1])
    ports["gateway"] = int(env["IGNIS_PORT"])  # /metrics on the HTTP port
    return ports


def test_prometheus_scrapes_the_ports_the_env_example_sets():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                scraped[static["labels"]["role"]] = int(port)
    assert scraped == _metrics_ports()
    # and the example command line in its comment names the same ones
    text = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    ports = _metrics_ports()
    assert f"--metrics-port {ports['engine']} --tierd-metrics-port {ports['tierd']}" in text


def test_operations_doc_names_the_same_metrics_ports():
    doc = (ROOT / "docs" / "operations.md").read_text()
    ports = _metrics_ports()
    for port in (ports["engine"], ports["tierd"]):
        assert str(port) in doc
    for stale in ("9400", "9401"):
        assert f"127.0.0.1:{stale}" not in doc


def test_boot_waits_for_the_network_and_every_service_orders_after_it():
    from tests.deploy.unit_commands import values

    for name in ("ignis.target", *SERVICES):
        assert "network-online.target" in values(name, "Wants", "Unit"), name
        assert "network-online.target" in values(name, "After", "Unit"), name


def test_the_gateway_unit_has_a_default_host_port_and_instance_the_env_file_overrides():
    from tests.deploy.unit_commands import ENV_EXAMPLE, expand, read_env_file, unit_environment

    gateway = parse("ignis-gateway.service")["Service"]
    argv = expand(gateway["ExecStart"], unit_environment("ignis-gateway.service", {"IGNIS_MODEL": "/m"}))
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--instance") + 1] == "default"
    env = dict(read_env_file(ENV_EXAMPLE), IGNIS_HOST="10.0.0.5")
    argv = expand(gateway["ExecStart"], unit_environment("ignis-gateway.service", env))
    assert argv[argv.index("--host") + 1] == "10.0.0.5"
    for name in SERVICES:  # every unit names ${IGNIS_INSTANCE}: none may expand it to ""
        argv = expand(parse(name)["Service"]["ExecStart"], unit_environment(name, {"IGNIS_MODEL": "/m"}))
        assert argv[argv.index("--instance") + 1] == "default", name


def test_tierd_stays_down_on_the_mlock_exit_status():
    from ignis.tierd import cli

    src = (ROOT / "tierd" / "cli.py").read_text()
    assert "return _fail(EXIT_MLOCK, str(e))" in src and "except MlockError" in src
    assert parse("ignis-tierd.service")["Service"]["RestartPreventExitStatus"].split() == [str(cli.EXIT_MLOCK)]
    assert cli.EXIT_MLOCK not in (0, 1, cli.EXIT_CONFIG)  # a status of its own, not a generic failure


def test_the_gateway_is_sandboxed():
    from tests.deploy.unit_commands import directives, values

    gw = dict(directives("ignis-gateway.service"))
    expected = {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
        "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes", "RestrictRealtime": "yes", "RestrictNamespaces": "yes",
        "CapabilityBoundingSet": "",
    }
    assert {k: gw.get(k) for k in expected} == expected
    families = values("ignis-gateway.service", "RestrictAddressFamilies")
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)  # the engine's ipc socket, HTTP, image fetches
    assert "ProcSubset" not in gw  # the process metrics read /proc/stat
    assert "MemoryDenyWriteExecute" not in gw


# Options that break a GPU process: a private /dev hides /dev/nvidia*; ProtectClock implies DeviceAllow=
# (a device allow-list); NoNewPrivileges and the seccomp/Protect options that imply it for a User= unit
# stop the setuid nvidia-modprobe the CUDA driver runs; RemoveIPC deletes the engine's /dev/shm blocks.
GPU_UNSAFE = ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "NoNewPrivileges",
              "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectHostname",
              "RestrictSUIDSGID", "RestrictNamespaces", "RestrictRealtime", "LockPersonality",
              "RestrictAddressFamilies", "SystemCallFilter", "SystemCallArchitectures",
              "MemoryDenyWriteExecute", "CapabilityBoundingSet", "RemoveIPC", "PrivateIPC", "PrivateTmp",
              "PrivateNetwork", "DynamicUser")


@pytest.mark.parametrize("name", ["ignis-engine.service", "ignis-tierd.service", "ignis-gateway.service"])
def test_no_unit_removes_the_shared_memory_the_others_map(name):
    svc = parse(name)["Service"]
    assert svc.get("RemoveIPC", "no") == "no" and "PrivateIPC" not in svc


@pytest.mark.parametrize("name", ["ignis-engine.service", "ignis-tierd.service"])
def test_the_gpu_units_are_sandboxed_only_where_cuda_cannot_notice(name):
    svc = parse(name)["Service"]
    assert not [k for k in GPU_UNSAFE if k in svc]
    assert svc["ProtectSystem"] == "full" and svc["ProtectHome"] == "read-only"
    assert svc["LimitMEMLOCK"] == "infinity"


def test_the_engine_compiles_triton_kernels_into_its_cache_directory():
    from tests.deploy.unit_commands import unit_environment, values

    assert values("ignis-engine.service", "CacheDirectory") == ["ignis"]
    env = unit_environment("ignis-engine.service", {})
    assert Path(env["TRITON_CACHE_DIR"]).is_relative_to("/var/cache/ignis")
    assert Path(env["CUDA_CACHE_PATH"]).is_relative_to("/var/cache/ignis")
    # ignis.env can still point them elsewhere
    assert unit_environment("ignis-engine.service", {"TRITON_CACHE_DIR": "/x"})["TRITON_CACHE_DIR"] == "/x"


def test_the_api_key_in_the_shared_env_file_reaches_only_the_gateway():
    from tests.deploy.unit_commands import unit_environment

    env = {"IGNIS_API_KEY": "k", "IGNIS_MODEL": "/m"}
    assert unit_environment("ignis-gateway.service", env)["IGNIS_API_KEY"] == "k"
    for name in ("ignis-engine.service", "ignis-tierd.service"):
        assert "IGNIS_API_KEY" not in unit_environment(name, env), name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_gateway_rates_ok_in_systemd_analyze_security(tmp_path):
    ignis = Path(sys.executable).parent / "ignis"
    unit = tmp_path / "ignis-gateway.service"
    unit.write_text((UNITS / unit.name).read_text().replace("/usr/local/bin/ignis", str(ignis)))
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=30", str(unit)],
                          capture_output=True, text=True)
    if "--offline" in proc.stderr or "Unknown option" in proc.stderr:
        pytest.skip("this systemd-analyze has no --offline")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # exposure 3.0 or better (it was 9.2 UNSAFE)
