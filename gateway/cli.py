"""``ignis gateway``: the OpenAI-compatible HTTP server in front of one engine.

Loads the tokenizer and chat template of ``--model`` (default: the demo
model; ``--chat-template`` replaces the default model's template), connects to the engine's ZeroMQ endpoint, serves HTTP on uvloop, and
prints ``READY http://HOST:PORT`` on stdout once listening (the port is the
bound one, useful with ``--port 0``). SIGTERM, SIGINT or SIGHUP stops accepting,
gives in-flight requests ``--shutdown-timeout`` seconds, and aborts the rest
at the engine. The API key comes from ``--api-key-file``, ``IGNIS_API_KEY``
or ``--api-key`` (shared.api_key). Connections go through
``gateway.listener`` (connection cap, header deadline); with ``--ssl-certfile``
and ``--ssl-keyfile`` it serves HTTPS (``gateway.tls``). Imports no torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys

import uvloop
from aiohttp import web

from ignis.shared.api_key import resolve_api_key
from ignis.gateway.app import build_app
from ignis.gateway.chat_template import template_option
from ignis.gateway.config import GatewayConfig
from ignis.gateway.listener import CONNECTIONS, LINGER_S, Connections, listen
from ignis.gateway.protocol_errors_log import quiet_protocol_errors
from ignis.gateway.state import STATE
from ignis.gateway.tls import server_context
from ignis.gateway.tokenizer import load_model_files
from ignis.shared import sdnotify
from ignis.shared.flags import add_flags, from_args
from ignis.shared.logs import setup_logging
from ignis.shared.loop_watchdog import LoopWatchdog, StopDeadline
from ignis.shared.hf_cache import use_cache_dir
from ignis.shared.model_names import model_specs
from ignis.shared.runtime import RuntimeDirError, endpoints, ensure_runtime_dir
from ignis.shared.tokenizer_files import TokenizerFilesError

log = logging.getLogger("ignis.gateway")

STOP_SPARE_S = 10.0
SLOW_STOP_S = 5.0  # a stop still going this long logs what it waits for


def add_arguments(parser) -> None:
    add_flags(parser, GatewayConfig)


def _model_dir(path: str | None) -> str:
    if path:
        return path
    from ignis.shared.demo import ensure_demo_model  # numpy + safetensors + tokenizers only

    return str(ensure_demo_model())


def _endpoint(config: GatewayConfig) -> str:
    if config.engine_endpoint:
        return config.engine_endpoint
    return endpoints(ensure_runtime_dir(config.runtime_dir), config.instance).engine


def stop_deadline_s(shutdown_timeout: float) -> float:
    """How long a stop may take before it counts as stuck: background responses get ``--shutdown-timeout``,
    then aiohttp gives each open request that long to finish and that long again once cancelled (each rounded
    up to a second), then the engine connection closes at once; 10 s spare."""
    return 3 * shutdown_timeout + STOP_SPARE_S


async def serve(app: web.Application, config: GatewayConfig, tls=None) -> int:
    """``tls``: the HTTPS context (``gateway.tls``; None: plain HTTP)."""
    connections: Connections = app[CONNECTIONS]
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=config.shutdown_timeout,
                           keepalive_timeout=config.keepalive_timeout, lingering_time=LINGER_S)
    try:
        await runner.setup()  # connects to the engine (a malformed endpoint fails here)
    except OSError as e:
        await runner.cleanup()
        print(f"ignis gateway: --engine-endpoint {config.engine_endpoint or 'auto'}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    try:
        server = await listen(runner, connections, config.host, config.port, tls, config.header_read_timeout)
    except OSError as e:
        await runner.cleanup()
        print(f"ignis gateway: cannot listen on {config.host}:{config.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: a closed terminal
        loop.add_signal_handler(sig, stop.set)
    url = f"{'https' if tls is not None else 'http'}://{config.host}:{port}"
    log.info("gateway serving on %s", url)
    print(f"READY {url}", flush=True)
    sdnotify.ready(f"serving on {url}")
    beat = sdnotify.LoopBeat(loop)
    watchdog = sdnotify.Watchdog(alive=beat.alive).start()  # pings while the loop turns
    stuck = LoopWatchdog(config.watchdog_timeout, beat.stall, "gateway event loop").start()
    await stop.wait()
    stuck.stop()
    watchdog.stop()
    sdnotify.stopping()
    log.info("gateway stopping")
    StopDeadline(stop_deadline_s(config.shutdown_timeout), "gateway").start()
    report = asyncio.create_task(_report_slow_stop(connections, SLOW_STOP_S, config.shutdown_timeout))
    server.close()
    try:
        await runner.cleanup()
    finally:
        report.cancel()
    return 0


def _awaiting(coro, depth: int = 12) -> str:
    """Where a task's coroutine is: each coroutine it awaits, outermost first."""
    steps = []
    while coro is not None and len(steps) < depth:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        steps.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(steps) or "not started"


async def _report_slow_stop(connections: Connections, after_s: float, drain_s: float) -> None:
    """A stop still going ``after_s`` seconds on says so. While connections drain (aiohttp may take
    ``drain_s``, the --shutdown-timeout, twice) that is one INFO line; a stop with nothing left to drain, or
    one still going ``after_s`` past twice the drain, is not a drain: it logs a WARNING with what it waits for, each
    pending task's coroutine and where it is (a request in flight, a background run, a stuck close)."""
    await asyncio.sleep(after_s)
    waited = after_s
    if connections.open:
        # aiohttp's cleanup may take the --shutdown-timeout twice (its handlers, then its connections)
        log.info("the gateway is still stopping after %.0f s: draining %d connections (their handlers end "
                 "by the --shutdown-timeout, %.0f s)", after_s, connections.open, drain_s)
        await asyncio.sleep(2 * drain_s)
        waited += 2 * drain_s
    me = asyncio.current_task()
    lines = []
    for task in asyncio.all_tasks():
        if task is me or task.done():
            continue
        lines.append(f"  {task.get_name()}: {_awaiting(task.get_coro())}")
    log.warning("the gateway is still stopping after %.0f s: %d connections open, %d tasks pending:\n%s",
                waited, connections.open, len(lines), "\n".join(lines))


def run(args) -> int:
    from ignis.shared.demo import DemoModelUnavailable

    level = getattr(args, "uvicorn_log_level", None)
    setup_logging("gateway", "INFO" if level == "trace" else level)  # (uvicorn's trace: our info)
    quiet_protocol_errors()
    try:
        key = resolve_api_key(args.api_key, args.api_key_file)
        config = from_args(GatewayConfig, args, api_key=key)
        use_cache_dir(config.download_dir)
        specs = model_specs(config.model, config.served_model_name)
        loaded = {name: load_model_files(_model_dir(path)) for name, path in specs}
        default = specs[0][0]
        if config.chat_template is not None:  # the operator's template instead of the checkpoint's
            loaded[default] = dataclasses.replace(loaded[default], chat_template=template_option(config.chat_template))
            log.info("chat template of %s: from --chat-template (the checkpoint's own is not used)", default)
        tls = server_context(config.ssl_keyfile, config.ssl_certfile, config.ssl_ca_certs, config.ssl_cert_reqs)
        endpoint = _endpoint(config)
        app = build_app(config, loaded.pop(default), default, endpoint, more_models=loaded)
    except (ValueError, OSError, RuntimeDirError, TokenizerFilesError, DemoModelUnavailable) as exc:
        print(f"ignis gateway: {exc}", file=sys.stderr)
        return 2
    log.info("gateway for model %s, engine at %s", app[STATE].model_name, endpoint)
    return uvloop.run(serve(app, config, tls))
