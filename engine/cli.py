"""``ignis engine``: load the model, print the memory plan, serve over ZeroMQ until SIGTERM."""

from __future__ import annotations

import logging
import sys

from ignis.engine.config import EngineConfig
from ignis.shared.flags import add_flags, from_args
from ignis.shared.logs import setup_logging

log = logging.getLogger("ignis.engine")

LOCK_MARGIN_S = 15.0
"""How much longer than its own shutdown timeout an engine waits for a predecessor still holding its socket."""


def _cannot_start(message: str) -> int:
    """A start error: one line in the log and on stderr, exit code 2."""
    log.error("engine cannot start: %s", message)
    print(f"ignis engine: {message}", file=sys.stderr)
    return 2


def add_arguments(parser) -> None:
    add_flags(parser, EngineConfig)


def build_server(config: EngineConfig):
    """Load the default model and bind the engine's socket, ready to serve."""
    from ignis.engine.kv_events import open_kv_events
    from ignis.engine.lora_updates import AdapterRegistry
    from ignis.engine.runtime import configured_lengths, load_runtime
    from ignis.engine.server import EngineServer
    from ignis.shared.hf_cache import use_cache_dir
    from ignis.shared.model_names import lora_specs, model_specs
    from ignis.shared.process_lock import hold_endpoint
    from ignis.shared.runtime import endpoints, ensure_runtime_dir

    from ignis.shared.shm_blocks import unlink_orphans

    if config.endpoint:
        endpoint = config.endpoint
    else:
        endpoint = endpoints(ensure_runtime_dir(config.runtime_dir), config.instance).engine
    # before anything is loaded or bound: a second engine of this instance is refused, one still draining
    # (its supervisor killed) is waited for (shared.process_lock)
    hold_endpoint(endpoint, f"the engine socket of instance {config.instance!r}",
                  wait_s=config.shutdown_timeout + LOCK_MARGIN_S)

    orphans = unlink_orphans()
    if orphans:  # an engine killed before it could unlink its host blocks (kill -9, OOM)
        log.warning("unlinked %d shared-memory blocks a dead engine left: %s", len(orphans), ", ".join(orphans))
    use_cache_dir(config.download_dir)
    specs = model_specs(config.model, config.served_model_name)
    dirs = dict(specs)
    default = specs[0][0]
    registry = AdapterRegistry(lora_specs(config.lora_modules, list(dirs)))
    kv_events = open_kv_events(config)  # ValueError when its sockets cannot be opened
    try:
        runtime = load_runtime(config, default, dirs[default], kv_events, registry.specs())
    except BaseException:
        if kv_events is not None:
            kv_events.close(0)
        raise
    return EngineServer(config, runtime, endpoint, model_dirs=dirs,
                        loader=lambda name: load_runtime(config, name, dirs[name], kv_events, registry.specs()),
                        kv_events=kv_events, adapters=registry, lengths=configured_lengths(config, dirs))


def run(args) -> int:
    from ignis.shared.loop_watchdog import LoopWatchdog
    from ignis.kernels.backend import KernelPathError
    from ignis.shared import sdnotify
    from ignis.shared.demo import DemoModelUnavailable
    from ignis.shared.process_lock import remove_socket_file
    from ignis.shared.runtime import RuntimeDirError

    setup_logging("engine")
    try:
        config = from_args(EngineConfig, args)
        import torch

        torch.set_num_threads(config.resolved_cpu_threads())
        log.info("engine CPU math on %d threads", torch.get_num_threads())
        sdnotify.status("loading model")
        sdnotify.extend_timeout(600)
        server = build_server(config)
    except (ValueError, OSError, RuntimeDirError, DemoModelUnavailable, KernelPathError) as exc:
        return _cannot_start(str(exc))
    server.install_signal_handlers()
    if config.metrics_port is not None:
        try:
            port = server.metrics.serve(config.metrics_port, config.metrics_host)
        except OSError as exc:
            server.channel.close()
            if server.kv_events is not None:
                server.kv_events.close()
            remove_socket_file(server.endpoint)  # bound already: this process's to delete
            return _cannot_start(f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: {exc}")
        log.info("engine metrics on http://%s:%d/metrics", config.metrics_host, port)
        print(f"METRICS {port}", flush=True)
    if server.kv_events is not None:
        log.info("engine KV events on %s (replay: %s)", config.kv_events_endpoint,
                 config.kv_events_replay_endpoint or "off")
    log.info("engine serving %s on %s", server.model_name, server.endpoint)
    print(f"READY {server.endpoint}", flush=True)
    sdnotify.ready(f"serving {server.model_name}")
    watchdog = sdnotify.Watchdog(alive=server.alive).start()
    stuck = LoopWatchdog(config.watchdog_timeout, server.stall).start()
    try:
        return server.serve_forever()
    finally:
        stuck.stop()
        watchdog.stop()
        sdnotify.stopping()
        remove_socket_file(server.endpoint)
