"""The engine process's loop: receives requests over ZeroMQ, runs rounds, streams tokens back.

One loop, one thread of compute::

    drain inbox (``GATEWAY_TO_ENGINE``)     ->  intake, aborts, Stats replies, resets asked, the
                                            profiler started or stopped, adapters loaded, unloaded, listed
    grammar compiles that ended             ->  their requests taken in again, or refused
    gone gateways (engine.gateway_watch)    ->  their requests aborted ("gateway gone")
    between rounds                          ->  model switch or idle unload, cache resets
    plan = scheduler.schedule()             ->  Finished for aborts freed now
    result = runner.run(plan)               ->  one forward, one token per stream
    ended = scheduler.update(result)        ->  TokenBatch per gateway, Finished, done line

The socket is owned by a :class:`Channel` I/O thread; this loop only touches
its queues. Nothing a peer sends can stop the loop: garbage is answered by the
channel, a bad request is refused with a reason. Its parts: ``engine.intake``
(requests in), ``engine.served_models`` (which model is loaded),
``engine.token_streams`` (tokens and ends out), ``engine.engine_stats`` (the
Stats reply and gauges), ``engine.kv_events`` (block events of the retained
store, one batch per loop turn, when ``--kv-events-endpoint`` is set).
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time

import zmq

from ignis.engine.cache_flushes import CacheFlushes
from ignis.engine.config import EngineConfig
from ignis.engine.engine_stats import loaded_stats, set_gauges, unloaded_stats
from ignis.engine.gateway_watch import GatewayWatch
from ignis.engine.intake import Intake
from ignis.engine.lora_updates import AdapterRegistry, LoraUpdates
from ignis.engine.metrics import EngineMetrics
from ignis.engine.profiling import RoundProfiler
from ignis.engine.served_models import LOAD_GRACE_S, ServedModels
from ignis.engine.token_streams import TokenStreams
from ignis.shared.stop_request import StopRequest
from ignis.shared.wire import (
    GATEWAY_TO_ENGINE,
    Abort,
    FlushCache,
    Generate,
    ListAdapters,
    LoadAdapter,
    Profile,
    Refused,
    Stats,
    StatsReply,
    UnloadAdapter,
)
from ignis.shared.zmq_queues import bind_router

log = logging.getLogger("ignis.engine")


class EngineServer:
    """Serves one model at a time out of ``model_dirs``; ``loader(name)`` loads another."""

    def __init__(self, config: EngineConfig, runtime, endpoint: str, model_dirs: dict | None = None,
                 loader=None, kv_events=None, adapters: AdapterRegistry | None = None, lengths: dict | None = None):
        self.config = config
        self.kv_events = kv_events
        self.models = ServedModels(runtime, model_dirs, loader, lengths)
        self.endpoint = endpoint
        self.metrics = EngineMetrics(self.models.default, vllm_compat=config.metrics_compat == "vllm")
        self._kv_dropped_seen = 0
        self._ctx = zmq.Context.instance()
        self._wake = threading.Event()
        self._stats_snapshot: dict | None = None
        self.channel = bind_router(self._ctx, endpoint, GATEWAY_TO_ENGINE, name="engine",
                                   notify=self._wake.set, answer_now=self._answer_stats)
        self.watch = GatewayWatch(self.channel, config.gateway_silence_timeout)
        self.streams = TokenStreams(self.channel, self.metrics, done_lines=config.log_requests)
        self.flushes = CacheFlushes(self.channel.send, refresh=self._update_gauges)
        self.profiler = RoundProfiler(config.profile_dir, config.instance, self.channel.send)
        self.lora_updates = LoraUpdates(config.enable_lora_updating, adapters or AdapterRegistry([]),
                                        config.max_lora_rank, self.models.dirs, self.channel.send,
                                        wake=self._wake.set)
        self._stopping = StopRequest()  # set by the signal handler: takes no lock
        self.intake = Intake(self.channel, self.metrics, self.models, self.streams, self._stopping,
                             config.max_queue, wake=self._wake.set)
        self._stop_deadline: float | None = None
        self._last_loop = time.monotonic()
        self._started_unix = round(time.time(), 3)
        # the names requests may give, in the served list's order; more than a reply carries: none (a gateway
        # then does not compare)
        served = tuple(self.models.dirs)
        self._served = served if len(served) <= StatsReply.MAX_MODELS else ()
        self._update_gauges()  # before the metrics endpoint and READY: a first scrape sees the loaded pool

    def _answer_stats(self, msg) -> StatsReply | None:
        """On the channel's I/O thread: Stats from the last round's snapshot, without waiting for a round."""
        if isinstance(msg, Stats) and self._stats_snapshot is not None:
            return StatsReply(self._stats_snapshot, self._served)
        return None

    @property
    def runtime(self):
        return self.models.runtime

    @property
    def model_name(self) -> str:
        return self.models.name

    @property
    def loaded(self) -> bool:
        return self.models.loaded

    @property
    def runner(self):
        return self.runtime.runner

    @property
    def scheduler(self):
        return self.runtime.scheduler

    @property
    def has_work(self) -> bool:
        return self.models.has_work

    # ----- models: switch and idle unload ------------------------------------------

    def _service_models(self) -> None:
        """Between rounds: switch when a request waits for another model and the current one drained;
        unload after --idle-unload-s of idleness."""
        models = self.models
        if models.pending and not models.has_work:
            target = models.wanted(models.pending[0][1].model)
            if not models.loaded or target != models.name:
                if models.loaded:
                    models.unload(f"switching to {target}", self.stats())
                try:
                    models.load(target)
                except Exception as exc:  # a model that cannot load fails its requests, not the engine
                    log.exception("cannot load model %s", target)
                    for peer, msg in models.drop_pending(target):
                        self.intake.refuse(peer, msg.id, "unknown_model", f"model {target!r} cannot be loaded: {exc}")
                    return
            models.redispatching = True
            try:
                for peer, msg in models.take_pending():
                    self.intake.generate(peer, msg)
            finally:
                models.redispatching = False
        if models.check_idle(self.config.idle_unload_s):
            models.unload(f"idle for {self.config.idle_unload_s:g}s", self.stats())

    # ----- lifecycle ---------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        """SIGTERM: stop admitting; in-flight work gets --shutdown-timeout to finish.
        Runs as a signal handler, so it takes no lock (the loop notices within 0.1 s)."""
        self._stopping.set()

    def stall(self) -> float:
        """Seconds the loop has spent in its current turn; a model load in progress counts only past its
        grace (``LOAD_GRACE_S``; shared.loop_watchdog)."""
        now, models = time.monotonic(), self.models
        loading = models.loading_since
        if loading is not None:
            return max(0.0, now - loading - LOAD_GRACE_S)
        return now - max(self._last_loop, models.load_ended)

    def alive(self) -> bool:
        """The loop went round recently (systemd's watchdog is pinged only while it does)."""
        return self.stall() < 30.0

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_stop)  # a closed terminal: stop as cleanly as on SIGTERM

    def serve_forever(self) -> int:
        self.channel.start()
        self._update_gauges()
        try:
            while True:
                self._last_loop = time.monotonic()
                self._drain_inbox(block=not self.has_work and not self.models.pending)
                if self._stopping.is_set():
                    if self._stop_deadline is None:
                        self._stop_deadline = time.monotonic() + self.config.shutdown_timeout
                    if not self.has_work:
                        for peer, msg in self.models.pending:
                            self.intake.refuse(peer, msg.id, "shutting_down", "the engine is shutting down")
                        self.models.pending.clear()
                        self.intake.refuse_compiling("shutting_down", "the engine is shutting down")
                        self.lora_updates.refuse_all("the engine is shutting down")
                        break
                    if time.monotonic() >= self._stop_deadline:
                        self._abort_all("engine shutting down")
                self.intake.compiled()
                self._abort_orphans()
                self._service_models()
                self.flushes.service(self.scheduler if self.loaded else None, self.intake.num_waiting)
                self.lora_updates.service(self.runtime if self.loaded else None,
                                          self.loaded and self.models.name == self.models.default)
                if self.loaded:
                    with self.profiler.round():
                        self._round()
                self._update_gauges()
                self._publish_kv_events()
        finally:
            self._drain_inbox(block=False)
            self.profiler.close()
            self.intake.compiles.close()
            time.sleep(0.05)
            self.channel.close()
            if self.kv_events is not None:
                self.kv_events.close()
        log.info("engine stopped")
        return 0

    # ----- inbox -------------------------------------------------------------------

    def _drain_inbox(self, block: bool) -> None:
        if block:
            self._wake.wait(timeout=0.1)
        self._wake.clear()
        while True:
            try:
                env = self.channel.inbox.get_nowait()
            except queue.Empty:
                break
            try:
                self._handle(env.peer, env.message)
            except Exception as exc:  # a handler bug must not take the loop down
                log.exception("error handling %s", type(env.message).__name__)
                rid = getattr(env.message, "id", "")
                if rid:
                    self.channel.send(Refused(rid, "bad_request", f"engine error: {exc}"), env.peer)
        self._count_wire_errors()

    def _count_wire_errors(self) -> None:
        """Each receiving socket's malformed messages into ``wire_errors_total{socket}``."""
        self.metrics.wire_errors.sync(self.channel.garbage_count, "gateway")
        tier_client = self.runtime.tier_client if self.runtime is not None else None
        if tier_client is not None:
            self.metrics.wire_errors.sync(tier_client.channel.garbage_count, "tierd")
        if self.kv_events is not None:
            self.metrics.wire_errors.sync(self.kv_events.malformed, "kv_events_replay")

    def _handle(self, peer: bytes, msg) -> None:
        if isinstance(msg, Generate):
            self.intake.generate(peer, msg)
        elif isinstance(msg, Abort):
            if self.intake.abort_pending(msg.id):
                return
            ev = self.scheduler.abort(msg.id, msg.reason, kept_tokens=msg.kept_tokens) if self.loaded else None
            if ev is not None:
                self._finish(ev)
        elif isinstance(msg, Stats):
            self.channel.send(StatsReply(self.stats(), self._served), peer)
        elif isinstance(msg, FlushCache):
            self.flushes.ask(peer, msg)
        elif isinstance(msg, Profile):
            self.profiler.handle(peer, msg)
        elif isinstance(msg, ListAdapters):
            self.lora_updates.list(peer, msg)
        elif isinstance(msg, (LoadAdapter, UnloadAdapter)):  # between rounds: the layers change only here
            self.lora_updates.handle(peer, msg, self.runtime if self.loaded else None,
                                     self.loaded and self.models.name == self.models.default, self._adapter_users)

    def _adapter_users(self, name: str) -> int:
        """Requests in flight that name LoRA adapter ``name`` (waiting before the scheduler included)."""
        waiting = [msg for _, msg in self.models.pending] + [msg for _, msg in self.intake.compiles.waiting.values()]
        tracked = sum(1 for t in self.streams.tracked.values() if t.adapter == name)
        return tracked + sum(1 for msg in waiting if msg.adapter == name and msg.id not in self.streams.tracked)

    def _abort_orphans(self) -> None:
        """Requests of a gateway that went away end now ("abort", "gateway gone"): their lanes and
        pages are free at the next round boundary."""
        if not self.watch.due():
            return
        peers = {t.peer for t in self.streams.tracked.values()} | self.intake.waiting_peers()
        for peer, why in self.watch.gone(peers):
            rids = [rid for rid, t in self.streams.tracked.items() if t.peer == peer]
            waiting = self.intake.waiting_ids(peer)
            log.warning("gateway %s is gone (%s): aborting its %d requests", peer.hex(), why,
                        len(rids) + len(waiting))
            for rid in waiting:
                self.intake.abort_pending(rid)
            for rid in rids:
                ev = self.scheduler.abort(rid, "abort", "gateway gone") if self.loaded else None
                if ev is not None:
                    self._finish(ev)

    # ----- rounds ------------------------------------------------------------------

    def _abort_all(self, message: str) -> None:
        for req in list(self.scheduler.running()) + list(self._waiting_ids()):
            rid = req if isinstance(req, str) else req.req_id
            ev = self.scheduler.abort(rid, "abort", message)
            if ev is not None:
                self._finish(ev)

    def _waiting_ids(self) -> list[str]:
        running = {r.req_id for r in self.scheduler.running()}
        return [rid for rid in self.streams.tracked if rid not in running]

    def _round(self) -> None:
        plan = self.scheduler.schedule()
        self.streams.admitted(plan.started, time.monotonic(), self.scheduler)
        if plan.preempted:
            self.metrics.preemptions.inc(len(plan.preempted))
        for ev in plan.finished:
            self._finish(ev)
        if plan.is_empty:
            if plan.started or plan.copies_before:
                self.runner.run(plan)  # lanes to set up (a resumed eviction decodes next round)
                self._note_undrafted(plan)
            return
        result, logprobs = self.runner.run(plan)
        self._note_undrafted(plan)
        self.metrics.prefill_tokens.inc(plan.num_prefill_tokens)
        ended = self.scheduler.update(result)  # cuts each speculative list where its request ended
        self.metrics.generation_tokens.inc(len(result.tokens) + sum(len(e) for e in result.extra.values()))
        self.streams.send_tokens(result, logprobs, self.scheduler)
        for ev in ended:
            self._finish(ev)

    def _note_undrafted(self, plan) -> None:
        """Requests that took a lane this round and will not draft though a drafter is in use: said in their
        done lines and counted (``TokenStreams.undrafted``)."""
        if self.runner.spec is not None and plan.started:
            self.streams.undrafted({s.req_id: why for s in plan.started
                                    if (why := self.runner.undrafted(s.req_id)) is not None})

    def _publish_kv_events(self) -> None:
        """This loop turn's block events as one batch (queued for the publisher's thread, never waited on)."""
        if self.kv_events is None:
            return
        self.kv_events.flush()
        dropped = self.kv_events.dropped
        if dropped != self._kv_dropped_seen:
            self.metrics.kv_events_dropped.inc(dropped - self._kv_dropped_seen)
            self._kv_dropped_seen = dropped

    def _finish(self, ev) -> None:
        self.runner.release(ev.req_id)
        self.streams.finish(ev, self.model_name)

    # ----- stats -------------------------------------------------------------------

    def _update_gauges(self) -> None:
        self._stats_snapshot = self.stats()  # replaced whole: the I/O thread reads it as it is
        set_gauges(self.metrics, self.runtime, self.intake.num_waiting,
                   self._stats_snapshot if self.loaded else self.models.unloaded_stats)  # taken once a turn

    def stats(self) -> dict:
        wire_errors = self.channel.garbage_count
        if not self.loaded:
            values = unloaded_stats(self.models.unloaded_stats, self.intake.num_waiting, wire_errors,
                                    self._started_unix)
        else:
            values = loaded_stats(self.runtime, list(self.models.dirs).index(self.models.name), wire_errors,
                                  self._started_unix, self.intake.num_waiting)
        values["lora_adapters_version"] = self.lora_updates.registry.version
        values.update(self.models.length_stats())
        return values
