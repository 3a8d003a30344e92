"""The engine process: receives requests over ZeroMQ, runs rounds, streams tokens back.

One loop, one thread of compute::

    drain inbox (Generate / Abort / Stats)  ->  scheduler.add / abort / reply
    plan = scheduler.schedule()             ->  Finished for aborts freed now
    result = runner.run(plan)               ->  one forward, one token per stream
    ended = scheduler.update(result)        ->  TokenBatch per gateway, Finished, done line

The socket is owned by a :class:`Channel` I/O thread; this loop only touches
its queues. Nothing a peer sends can stop the loop: garbage is answered by the
channel, a bad request is refused with a reason.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import orjson
import zmq

from ignis.engine.config import EngineConfig
from ignis.engine.metrics import EngineMetrics
from ignis.engine.request import Request
from ignis.shared.wire import (
    Abort,
    Finished,
    Generate,
    Refused,
    ReuseInfo,
    Stats,
    StatsReply,
    StreamTokens,
    Timings,
    TokenBatch,
    TokenLogprobs,
    Usage,
)
from ignis.shared.stop_request import StopRequest
from ignis.shared.zmq_queues import bind_router

log = logging.getLogger("ignis.engine")


@dataclass
class Tracked:
    """What the loop remembers about a request beyond the scheduler: who asked, and when."""

    peer: bytes
    request_class: str
    prompt_tokens: int
    arrived: float
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    extra: dict = field(default_factory=dict)


class EngineServer:
    """Serves one model at a time out of ``model_dirs``; ``loader(name)`` loads another."""

    def __init__(self, config: EngineConfig, runtime, endpoint: str, model_dirs: dict | None = None,
                 loader=None):
        self.config = config
        self.runtime = runtime
        self.model_dirs = dict(model_dirs or {runtime.name: None})
        self.default_model = next(iter(self.model_dirs))
        self.loader = loader
        self.model_name = runtime.name
        self.endpoint = endpoint
        self.metrics = EngineMetrics(self.default_model)
        self.tracked: dict[str, Tracked] = {}
        self._pending: deque = deque()  # (peer, Generate) waiting for a model switch or load
        self._redispatching = False
        self._last_busy = time.monotonic()
        self._unloaded_stats: dict = {}
        self._ctx = zmq.Context.instance()
        self._wake = threading.Event()
        self._stats_snapshot: dict | None = None
        self.channel = bind_router(self._ctx, endpoint, (Generate, Abort, Stats), name="engine",
                                   notify=self._wake.set, answer_now=self._answer_stats)
        self._stopping = StopRequest()  # set by the signal handler: takes no lock
        self._stop_deadline: float | None = None
        self._garbage_seen = 0
        self._last_loop = time.monotonic()
        self._started_unix = round(time.time(), 3)

    def _answer_stats(self, msg) -> StatsReply | None:
        """On the channel's I/O thread: Stats from the last round's snapshot, without waiting for a round."""
        if isinstance(msg, Stats) and self._stats_snapshot is not None:
            return StatsReply(self._stats_snapshot)
        return None

    @property
    def loaded(self) -> bool:
        return self.runtime is not None

    @property
    def runner(self):
        return self.runtime.runner

    @property
    def scheduler(self):
        return self.runtime.scheduler

    @property
    def vocab_size(self) -> int:
        return self.runtime.vocab_size

    @property
    def info(self) -> dict:
        return self.runtime.info

    @property
    def has_work(self) -> bool:
        return self.loaded and self.scheduler.has_work

    # ----- models: switch and idle unload ------------------------------------------

    def _unload(self, why: str) -> None:
        name = self.runtime.name
        self._unloaded_stats = {k: v for k, v in self.stats().items()
                                if k in ("max_model_len", "decode_lanes", "pool_pages_total", "vocab_size")}
        self._unloaded_stats["pool_pages_free"] = self._unloaded_stats.get("pool_pages_total", 0)
        self.runtime.close()
        self.runtime = None
        log.info("unloaded model %s (%s): all retained state freed in every tier", name, why)

    def _load(self, name: str) -> None:
        from ignis.shared import sdnotify

        sdnotify.status(f"loading model {name}")
        sdnotify.extend_timeout(600)
        self.runtime = self.loader(name)
        self.model_name = name
        self._last_busy = time.monotonic()
        sdnotify.status(f"serving {name}")

    def _service_models(self) -> None:
        """Between rounds: switch when a request waits for another model and the current one drained;
        unload after --idle-unload-s of idleness."""
        if self._pending and not self.has_work:
            target = self._pending[0][1].model or (self.model_name if self.loaded else self.default_model)
            if not self.loaded or target != self.model_name:
                if self.loaded:
                    self._unload(f"switching to {target}")
                try:
                    self._load(target)
                except Exception as exc:  # a model that cannot load fails its requests, not the engine
                    log.exception("cannot load model %s", target)
                    for peer, msg in [p for p in self._pending if (p[1].model or target) == target]:
                        self._pending.remove((peer, msg))
                        self._refuse(peer, msg.id, "unknown_model", f"model {target!r} cannot be loaded: {exc}")
                    return
            pending, self._pending = list(self._pending), deque()
            self._redispatching = True
            try:
                for peer, msg in pending:
                    self._generate(peer, msg)
            finally:
                self._redispatching = False
        if self.loaded and self.has_work:
            self._last_busy = time.monotonic()
        elif (self.loaded and self.config.idle_unload_s is not None and not self._pending
              and time.monotonic() - self._last_busy > self.config.idle_unload_s):
            self._unload(f"idle for {self.config.idle_unload_s:g}s")

    # ----- lifecycle ---------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        """SIGTERM: stop admitting; in-flight work gets --shutdown-timeout to finish.
        Runs as a signal handler, so it takes no lock (the loop notices within 0.1 s)."""
        self._stopping.set()

    def alive(self) -> bool:
        """The loop went round recently (the watchdog pings only while it does)."""
        return time.monotonic() - self._last_loop < 30.0

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def serve_forever(self) -> int:
        self.channel.start()
        self._update_gauges()
        try:
            while True:
                self._last_loop = time.monotonic()
                self._drain_inbox(block=not self.has_work and not self._pending)
                if self._stopping.is_set():
                    if self._stop_deadline is None:
                        self._stop_deadline = time.monotonic() + self.config.shutdown_timeout
                    if not self.has_work:
                        for peer, msg in self._pending:
                            self._refuse(peer, msg.id, "shutting_down", "the engine is shutting down")
                        self._pending.clear()
                        break
                    if time.monotonic() >= self._stop_deadline:
                        self._abort_all("engine shutting down")
                self._service_models()
                if self.loaded:
                    self._round()
                self._update_gauges()
        finally:
            self._drain_inbox(block=False)
            time.sleep(0.05)
            self.channel.close()
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
        if self.channel.garbage_count != self._garbage_seen:
            self.metrics.garbage.inc(self.channel.garbage_count - self._garbage_seen)
            self._garbage_seen = self.channel.garbage_count

    def _handle(self, peer: bytes, msg) -> None:
        if isinstance(msg, Generate):
            self._generate(peer, msg)
        elif isinstance(msg, Abort):
            for item in list(self._pending):
                if item[1].id == msg.id:
                    self._pending.remove(item)
                    self.channel.send(Finished(msg.id, "abort", Usage(len(item[1].prompt_ids), 0)), item[0])
                    return
            ev = self.scheduler.abort(msg.id) if self.loaded else None
            if ev is not None:
                self._finish(ev)
        elif isinstance(msg, Stats):
            self.channel.send(StatsReply(self.stats()), peer)

    def _refuse(self, peer: bytes, rid: str, reason: str, message: str) -> None:
        self.metrics.refused.labels(self.model_name, reason).inc()
        self.channel.send(Refused(rid, reason, message), peer)

    def _generate(self, peer: bytes, msg: Generate) -> None:
        if self._stopping.is_set():
            return self._refuse(peer, msg.id, "shutting_down", "the engine is shutting down")
        if msg.model is not None and msg.model not in self.model_dirs:
            return self._refuse(peer, msg.id, "unknown_model",
                                f"model {msg.model!r} is not served here (models: {', '.join(self.model_dirs)})")
        wanted = msg.model or (self.model_name if self.loaded else self.default_model)
        if (not self.loaded or wanted != self.model_name or self._pending) and not (
                self._redispatching and not self._pending and self.loaded and wanted == self.model_name):
            if len(self._pending) >= self.config.max_queue:
                return self._refuse(peer, msg.id, "queue_full",
                                    f"{len(self._pending)} requests wait for a model load (max_queue)")
            self._pending.append((peer, msg))  # served, in arrival order, once the model it names is loaded
            return
        if not msg.prompt_ids:
            return self._refuse(peer, msg.id, "bad_request", "the prompt is empty")
        bad = next((t for t in msg.prompt_ids if t >= self.vocab_size), None)
        if bad is not None:
            return self._refuse(peer, msg.id, "bad_request",
                                f"token id {bad} is outside the vocabulary (size {self.vocab_size})")
        if msg.id in self.tracked:
            return self._refuse(peer, msg.id, "bad_request", f"request id {msg.id!r} is already in use")
        req = Request.from_generate(msg, self.scheduler.config.page_tokens)
        if not self.scheduler.store.enabled:
            req.must_cut_at = ()  # nothing is captured, so prefill runs in one traversal
        refusal = self.scheduler.add(req)
        if refusal is not None:
            return self._refuse(peer, msg.id, refusal.reason, refusal.message)
        self.tracked[msg.id] = Tracked(peer, msg.request_class, len(msg.prompt_ids), time.monotonic())

    # ----- rounds ------------------------------------------------------------------

    def _abort_all(self, message: str) -> None:
        for req in list(self.scheduler.running()) + list(self._waiting_ids()):
            rid = req if isinstance(req, str) else req.req_id
            ev = self.scheduler.abort(rid, "abort", message)
            if ev is not None:
                self._finish(ev)

    def _waiting_ids(self) -> list[str]:
        running = {r.req_id for r in self.scheduler.running()}
        return [rid for rid in self.tracked if rid not in running]

    def _round(self) -> None:
        plan = self.scheduler.schedule()
        now = time.monotonic()
        for s in plan.started:
            t = self.tracked.get(s.req_id)
            if t is not None and t.admitted is None:
                t.admitted = now
                self.metrics.queue_time.observe(now - t.arrived)
        if plan.preempted:
            self.metrics.preemptions.inc(len(plan.preempted))
        for ev in plan.finished:
            self._finish(ev)
        if plan.is_empty:
            if plan.started or plan.copies_before:
                self.runner.run(plan)  # lanes to set up (a resumed eviction decodes next round)
            return
        result, logprobs = self.runner.run(plan)
        self.metrics.prefill_tokens.inc(plan.num_prefill_tokens)
        self.metrics.generation_tokens.inc(len(result.tokens))
        ended = self.scheduler.update(result)
        now = time.monotonic()
        by_peer: dict[bytes, list[StreamTokens]] = {}
        for rid, token in result.tokens.items():
            t = self.tracked.get(rid)
            req = self.scheduler.get(rid)
            if t is None or (req is not None and req.pending_end is not None):
                continue
            if t.first_token is None:
                t.first_token = now
                self.metrics.ttft.observe(now - t.arrived)
            else:
                self.metrics.itl.observe(now - t.last_token)
            t.last_token = now
            t.tokens += 1
            lp = logprobs.get(rid)
            wire_lp = None if lp is None else TokenLogprobs(
                logprobs=(lp.token_logprob,), top_ids=(tuple(i for i, _ in lp.top),),
                top_logprobs=(tuple(v for _, v in lp.top),))
            by_peer.setdefault(t.peer, []).append(StreamTokens(rid, (token,), wire_lp))
        for peer, streams in by_peer.items():
            self.channel.send(TokenBatch(tuple(streams)), peer)
        for ev in ended:
            self._finish(ev)

    def _finish(self, ev) -> None:
        self.runner.release(ev.req_id)
        t = self.tracked.pop(ev.req_id, None)
        if t is None:
            return
        now = time.monotonic()
        admitted = t.admitted if t.admitted is not None else now
        first = t.first_token
        timings = Timings(
            queue_ms=round((admitted - t.arrived) * 1000, 3),
            prefill_ms=round(((first or now) - admitted) * 1000, 3),
            ttft_ms=round(((first or now) - t.arrived) * 1000, 3),
        )
        usage = Usage(prompt_tokens=t.prompt_tokens, completion_tokens=ev.completion_tokens,
                      cached_tokens=ev.cached_tokens)
        reuse = ReuseInfo(kind=ev.reuse_kind, tier=ev.reuse_tier)
        # metrics first: a client that sees Finished and scrapes must see this request counted
        self.metrics.prefix_hits.inc(ev.cached_tokens)
        if ev.cached_tokens:
            self.metrics.reuse_hits.labels(self.metrics.model_name, ev.reuse_kind, ev.reuse_tier).inc()
            self.metrics.reuse_hit_tokens.labels(self.metrics.model_name, ev.reuse_kind, ev.reuse_tier).inc(
                ev.cached_tokens)
        self.metrics.finished.labels(self.model_name, ev.reason).inc()
        self.metrics.prompt_tokens.inc(t.prompt_tokens)
        self.metrics.prefix_queries.inc(t.prompt_tokens)
        self.metrics.e2e.observe(now - t.arrived)
        self.channel.send(Finished(ev.req_id, ev.reason, usage, reuse=reuse, timings=timings, message=ev.message),
                          t.peer)
        decode_s = (t.last_token - first) if first is not None and t.last_token is not None else 0.0
        done = {
            "event": "done", "id": ev.req_id, "class": t.request_class, "prompt_tokens": t.prompt_tokens,
            "cached_tokens": ev.cached_tokens, "completion_tokens": ev.completion_tokens,
            "reuse_kind": ev.reuse_kind, "tier": ev.reuse_tier, "slot": ev.reuse_slot, "queue_ms": timings.queue_ms, "prefill_ms": timings.prefill_ms,
            "ttft_ms": timings.ttft_ms,
            "decode_tokens_per_s": round((t.tokens - 1) / decode_s, 2) if decode_s > 0 and t.tokens > 1 else 0.0,
            "finish_reason": ev.reason,
        }
        log.info(orjson.dumps(done).decode())

    # ----- stats -------------------------------------------------------------------

    def _update_gauges(self) -> None:
        self._stats_snapshot = self.stats()  # replaced whole: the I/O thread reads it as it is
        if not self.loaded:
            self.metrics.running.set(0)
            self.metrics.waiting.set(len(self._pending))
            return
        pool = self.scheduler.pool
        self.metrics.running.set(self.scheduler.num_running)
        self.metrics.waiting.set(self.scheduler.num_waiting)
        self.metrics.pages_used.set(pool.num_used)
        self.metrics.pages_free.set(pool.num_free)
        self.metrics.kv_usage.set(pool.num_used / pool.num_pages)
        store = self.scheduler.stats()
        self.metrics.sync_store(store)
        self.metrics.live_evicting.set(store["live_evicting"])
        client = self.runtime.tier_client
        self.metrics.tierd_connected.set(1 if client is not None and client.welcome is not None else 0)
        self.metrics.retained_entries.set(store["retained_entries"])
        self.metrics.retained_lower_entries.set(store["retained_lower_entries"])
        self.metrics.retained_slots_free.set(store["retained_slots_free"])
        page_bytes = self.info.get("kv_pool_bytes", 0) // max(1, pool.num_pages)
        used_slots = store["retained_slots_total"] - store["retained_slots_free"]
        self.metrics.retained_bytes.set(store["retained_pages_held"] * page_bytes
                                        + used_slots * self.info.get("slot_bytes", 0))

    def stats(self) -> dict:
        if not self.loaded:
            return {**self._unloaded_stats, "model_loaded": 0, "num_requests_running": 0,
                    "num_requests_waiting": len(self._pending), "wire_errors": self.channel.garbage_count,
                    "engine_started_unix": self._started_unix}
        pool = self.scheduler.pool
        values = dict(self.scheduler.stats())
        values.update({
            "pool_pages_total": pool.num_pages,
            "pool_pages_free": pool.num_free,
            "pool_pages_used": pool.num_used,
            "decode_lanes": self.scheduler.config.decode_lanes,
            "max_model_len": self.scheduler.config.max_model_len,
            "vocab_size": self.vocab_size,
            "wire_errors": self.channel.garbage_count,
            "model_loaded": 1,
            "model_index": list(self.model_dirs).index(self.model_name),
            "engine_started_unix": self._started_unix,
        })
        values.update(self.info)
        return values
