"""tierd's flags: parsing, checks with the flag's name, and --kv-disk-bytes auto resolved per family."""

from __future__ import annotations

import argparse

import pytest

from ignis.shared.flags import add_flags, from_args
from ignis.tierd.config import TierdConfig


def parse(*argv) -> TierdConfig:
    p = argparse.ArgumentParser()
    add_flags(p, TierdConfig)
    return from_args(TierdConfig, p.parse_args(list(argv)))


def test_defaults():
    c = parse()
    assert c.reuse_kv_host_pool_bytes == 2 << 30 and c.kv_disk_bytes is None and c.require_mlock is False
    assert c.reuse_retained_interactive_ttl == 300.0
    assert c.resolve_disk_bytes("qwen3_5") == 0 and c.resolve_disk_bytes("qwen3_next") == 4 << 30
    assert c.disk_dir("/run/ignis").as_posix() == "/run/ignis/default-kv-disk"


def test_explicit_values():
    c = parse("--reuse-kv-host-pool-bytes", "512M", "--kv-disk-bytes", "1G", "--require-mlock", "on",
              "--instance", "b", "--kv-disk-dir", "/var/tmp/kv")
    assert c.reuse_kv_host_pool_bytes == 512 << 20 and c.require_mlock is True
    assert c.resolve_disk_bytes("qwen3_5") == 1 << 30 and c.disk_dir("/x").as_posix() == "/var/tmp/kv"
    off = parse("--kv-disk-bytes", "0")
    assert not off.disk_may_be_on and off.resolve_disk_bytes("qwen3_next") == 0
    assert parse("--kv-disk-bytes", "auto").kv_disk_bytes is None


@pytest.mark.parametrize("kwargs,flag", [
    ({"reuse_kv_host_pool_bytes": -1}, "--reuse-kv-host-pool-bytes"),
    ({"kv_disk_bytes": -5}, "--kv-disk-bytes"),
    ({"reuse_retained_interactive_ttl": float("nan")}, "--reuse-retained-interactive-ttl"),
    ({"instance": "../x"}, "--instance"),
    ({"metrics_port": 70000}, "--metrics-port"),
])
def test_bad_values_name_their_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        TierdConfig(**kwargs)


def test_auto_for_an_unknown_family_asks_for_the_flag():
    with pytest.raises(ValueError, match="pass --kv-disk-bytes explicitly"):
        TierdConfig().resolve_disk_bytes("llama")
