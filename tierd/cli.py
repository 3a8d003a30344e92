"""``ignis tierd``: allocate and lock the arena, prepare KV-disk, serve the engine until SIGTERM.

Start order (each step fails with a message and a non-zero exit, nothing left behind):
config -> runtime dir -> arena (mmap, touch, mlock) -> KV-disk directory wipe
-> socket -> metrics -> ``READY <endpoint>`` on stdout. On exit KV-disk is wiped
and its directory removed.
"""

from __future__ import annotations

import logging
import sys

from ignis.shared.flags import add_flags, from_args
from ignis.shared.logs import setup_logging

log = logging.getLogger("ignis.tierd")

EXIT_CONFIG = 2
LOCK_WAIT_S = 30.0
"""How long a tierd waits for a predecessor still holding its socket (or its KV-disk directory)."""
EXIT_MLOCK = 3


def add_arguments(parser) -> None:
    from ignis.tierd.config import TierdConfig

    add_flags(parser, TierdConfig)


def _fail(code: int, message: str) -> int:
    log.error("tierd cannot start: %s", message)
    print(f"ignis tierd: {message}", file=sys.stderr)
    return code


def run(args) -> int:
    from ignis.shared.process_lock import hold_directory, hold_endpoint, remove_socket_file
    from ignis.shared.runtime import RuntimeDirError, endpoints, ensure_runtime_dir
    from ignis.tierd import disk as kvdisk
    from ignis.tierd import disk_mac
    from ignis.tierd.arena import Arena, MlockError
    from ignis.tierd.config import TierdConfig
    from ignis.tierd.metrics import TierdMetrics
    from ignis.tierd.server import TierServer

    setup_logging("tierd")
    try:
        config = from_args(TierdConfig, args)
        runtime = ensure_runtime_dir(config.runtime_dir)
        endpoint = config.endpoint or endpoints(runtime, config.instance).tierd
        # before the arena or KV-disk is touched: a second tierd of this instance is refused, one still
        # draining (its supervisor killed) is waited for (shared.process_lock)
        hold_endpoint(endpoint, f"the tierd socket of instance {config.instance!r}", wait_s=LOCK_WAIT_S)
    except (ValueError, RuntimeDirError, OSError) as e:
        return _fail(EXIT_CONFIG, str(e))
    try:
        arena = Arena(config.reuse_kv_host_pool_bytes, lock="require" if config.require_mlock else "try")
    except MlockError as e:
        return _fail(EXIT_MLOCK, str(e))
    except (OSError, ValueError) as e:
        return _fail(EXIT_CONFIG, f"cannot allocate the {config.reuse_kv_host_pool_bytes}-byte arena: {e}")
    if arena.unlocked_bytes:
        log.warning("ARENA NOT FULLY LOCKED: %d of %d bytes are unlocked and can be swapped out (mlock: %s). "
                    "Raise the limit (LimitMEMLOCK=infinity under systemd, `ulimit -l unlimited` by hand) "
                    "or shrink --reuse-kv-host-pool-bytes", arena.unlocked_bytes, arena.nbytes, arena.lock_error)
    from ignis.tierd.copier import FAULT_PAUSE_ENV, fault_pause_s

    pause = fault_pause_s()
    if pause:
        log.warning("FAULT INJECTION: %s=%s pauses every copy half way (for tests only)", FAULT_PAUSE_ENV, pause)
    if kvdisk.fault_disk_write_s():
        log.warning("FAULT INJECTION: %s=%s delays every KV-disk write (for tests only)",
                    kvdisk.FAULT_DISK_WRITE_ENV, kvdisk.fault_disk_write_s())
    if kvdisk.fault_disk_full():
        log.warning("FAULT INJECTION: %s=1 fails every KV-disk write as a full disk (for tests only)",
                    kvdisk.FAULT_DISK_FULL_ENV)
    disk_dir = config.disk_dir(runtime) if config.disk_may_be_on else None
    mac_key = b""
    try:
        if disk_dir is not None:
            kvdisk.make_dir(disk_dir)  # the lock is taken before the wipe
            hold_directory(disk_dir, f"the KV-disk directory {disk_dir}", wait_s=LOCK_WAIT_S)
            kvdisk.prepare_dir(disk_dir)
            mac_key = kvdisk.load_mac_key(config.disk_key_file(runtime))
            disk_mac.poly1305()
    except (kvdisk.ForeignFilesError, kvdisk.MacKeyError, OSError) as e:
        arena.close()
        return _fail(EXIT_CONFIG, str(e))
    except ImportError as e:
        arena.close()
        return _fail(EXIT_CONFIG, f"KV-disk MACs its files with Poly1305 from the cryptography package, which "
                                  f"does not import ({e}): pip install cryptography, or --kv-disk-bytes 0")
    metrics = TierdMetrics(config.instance)
    try:
        try:
            server = TierServer(config, arena, endpoint, disk_dir, metrics, mac_key=mac_key)
        except OSError as e:
            return _fail(EXIT_CONFIG, str(e))
        server.install_signal_handlers()
        if config.metrics_port is not None:
            try:
                port = metrics.serve(config.metrics_port, config.metrics_host)
            except OSError as e:
                server.channel.close()
                remove_socket_file(endpoint)  # bound already: this process's to delete
                return _fail(EXIT_CONFIG, f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: {e}")
            log.info("tierd metrics on http://%s:%d/metrics", config.metrics_host, port)
            print(f"METRICS {port}", flush=True)
        if disk_dir is None:
            disk_text = "off"
        elif config.kv_disk_bytes is None:
            disk_text = f"{disk_dir} (auto: the ceiling follows the model family at hello)"
        else:
            disk_text = f"{disk_dir} ({config.kv_disk_bytes} bytes)"
        log.info("tierd serving on %s: arena %d bytes (%d locked), KV-disk %s", endpoint, arena.nbytes,
                 arena.locked_bytes, disk_text)
        print(f"READY {endpoint}", flush=True)
        from ignis.shared import sdnotify

        sdnotify.ready(f"arena {arena.nbytes} bytes ({arena.locked_bytes} locked), KV-disk {disk_text}")
        watchdog = sdnotify.Watchdog(alive=server.alive).start()
        try:
            return server.serve_forever()
        finally:
            watchdog.stop()
            sdnotify.stopping()
            remove_socket_file(endpoint)
    finally:
        if disk_dir is not None:
            kvdisk.wipe_dir(disk_dir, remove=True)
        arena.close()
