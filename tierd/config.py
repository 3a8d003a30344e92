"""The tier daemon's config: one frozen dataclass whose fields are the ``ignis tierd`` flags.

``kv_disk_bytes`` is stored as given: None means "auto", resolved at the
engine's hello from the model family (``resolve_disk_bytes``): KV-disk off
for the Qwen3.5 dense family, 4 GiB for Qwen3-Next.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ignis.shared.flags import field_doc, parse_bytes
from ignis.shared.runtime import check_instance_name

DISK_AUTO_BYTES = {"qwen3_5": 0, "qwen3_next": 4 << 30}
"""``--kv-disk-bytes auto`` per model family."""


def _disk_bytes(text):
    return None if text in (None, "auto") else parse_bytes(text)


@dataclass(frozen=True)
class TierdConfig:
    reuse_kv_host_pool_bytes: int = field(default=2 << 30, metadata=field_doc(
        "KV-RAM arena size, e.g. 2G; allocated, touched and locked whole at start (0: KV-RAM off)",
        parse=parse_bytes))
    kv_disk_dir: str | None = field(default=None, metadata=field_doc(
        "directory of the KV-disk files, wiped at start and exit (default: RUNTIME_DIR/INSTANCE-kv-disk)"))
    kv_disk_key_file: str | None = field(default=None, metadata=field_doc(
        "the install's KV-disk MAC key (32 bytes, mode 0600, created at first start; "
        "default: RUNTIME_DIR/INSTANCE-kv-disk.key)"))
    kv_disk_bytes: int | None = field(default=None, metadata=field_doc(
        "KV-disk byte ceiling, e.g. 4G, 0 = off, or auto (default): off for Qwen3.5 dense, 4G for Qwen3-Next",
        parse=_disk_bytes))
    reuse_retained_interactive_ttl: float = field(default=300.0, metadata=field_doc(
        "seconds after which an idle interactive retained entry ranks as an agent's"))
    require_mlock: bool = field(default=False, metadata=field_doc(
        "on: exit if the whole arena cannot be locked (systemd units set it); off: lock what the limit allows "
        "and report the rest as unlocked"))
    runtime_dir: str | None = field(default=None, metadata=field_doc(
        "directory of the ipc sockets (default: $XDG_RUNTIME_DIR/ignis or /tmp/ignis-$UID)"))
    instance: str = field(default="default", metadata=field_doc(
        "instance name; socket, KV-disk directory and metrics are per instance"))
    endpoint: str | None = field(default=None, metadata=field_doc(
        "ZeroMQ endpoint tierd binds for its engine (default: ipc://RUNTIME_DIR/INSTANCE-tierd.sock)"))
    metrics_port: int | None = field(default=None, metadata=field_doc(
        "serve tierd's Prometheus metrics on this port (0 picks a free one; default: off)"))
    metrics_host: str = field(default="127.0.0.1", metadata=field_doc("address of the metrics endpoint"))

    def __post_init__(self):
        pool = self.reuse_kv_host_pool_bytes
        if type(pool) is not int or pool < 0:
            raise ValueError(f"--reuse-kv-host-pool-bytes must be a byte count >= 0, got {pool!r}")
        if self.kv_disk_bytes is not None and (type(self.kv_disk_bytes) is not int or self.kv_disk_bytes < 0):
            raise ValueError(f"--kv-disk-bytes must be a byte count >= 0 or auto, got {self.kv_disk_bytes!r}")
        ttl = self.reuse_retained_interactive_ttl
        if type(ttl) not in (int, float) or math.isnan(ttl) or ttl < 0:
            raise ValueError(f"--reuse-retained-interactive-ttl must be seconds >= 0, got {ttl!r}")
        if type(self.require_mlock) is not bool:
            raise ValueError(f"--require-mlock must be on or off, got {self.require_mlock!r}")
        check_instance_name(self.instance, "--instance")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics-port must be in 0..65535, got {self.metrics_port}")

    @property
    def disk_may_be_on(self) -> bool:
        """False only when --kv-disk-bytes is an explicit 0 (then the directory is never touched)."""
        return self.kv_disk_bytes != 0

    def resolve_disk_bytes(self, family: str) -> int:
        """The KV-disk ceiling for ``family`` (the flag's value unless it is auto)."""
        if self.kv_disk_bytes is not None:
            return self.kv_disk_bytes
        if family not in DISK_AUTO_BYTES:
            raise ValueError(f"--kv-disk-bytes auto: unknown model family {family!r} "
                             f"(known: {', '.join(DISK_AUTO_BYTES)}); pass --kv-disk-bytes explicitly")
        return DISK_AUTO_BYTES[family]

    def disk_key_file(self, runtime_dir: str | os.PathLike) -> Path:
        if self.kv_disk_key_file:
            return Path(os.path.abspath(self.kv_disk_key_file))
        return Path(runtime_dir) / f"{self.instance}-kv-disk.key"

    def disk_dir(self, runtime_dir: str | os.PathLike) -> Path:
        if self.kv_disk_dir:
            return Path(os.path.abspath(self.kv_disk_dir))
        return Path(runtime_dir) / f"{self.instance}-kv-disk"
