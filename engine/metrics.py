"""The engine's Prometheus metrics (``--metrics-port``), under the ``ignis:`` prefix.

Names follow vLLM's where the meaning matches (num_requests_running,
num_requests_waiting, kv_cache_usage_perc, prompt/generation tokens,
time_to_first_token_seconds, inter_token_latency_seconds) so dashboards and
cache-aware routers that read vLLM read us too. Each engine has its own
registry: nothing here is global, so several engines can live in one process
in tests.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ("model_name",)
        r = self.registry

        def gauge(name, doc):
            return Gauge(f"ignis:{name}", doc, labels, registry=r).labels(model_name)

        def counter(name, doc, extra=()):
            c = Counter(f"ignis:{name}", doc, labels + tuple(extra), registry=r)
            return c if extra else c.labels(model_name)

        self.model_name = model_name
        self.running = gauge("num_requests_running", "requests holding a lane")
        self.waiting = gauge("num_requests_waiting", "requests queued for a lane")
        self.kv_usage = gauge("kv_cache_usage_perc", "fraction of KV pool pages in use (0..1)")
        self.pages_used = gauge("kv_pool_pages_used", "KV pool pages held by sequences")
        self.pages_free = gauge("kv_pool_pages_free", "KV pool pages free")
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.prefill_tokens = counter("prefill_tokens", "prompt tokens actually prefilled (computed)")
        self.generation_tokens = counter("generation_tokens", "tokens generated")
        self.prefix_queries = counter("prefix_cache_queries", "prompt tokens looked up for reuse")
        self.prefix_hits = counter("prefix_cache_hits", "prompt tokens reused")
        self.finished = counter("request_success", "finished requests by finish reason", ("finished_reason",))
        self.refused = counter("request_refused", "requests refused by reason", ("reason",))
        self.preemptions = counter("num_preemptions", "running requests preempted for room")
        self.garbage = counter("wire_errors", "malformed messages received")
        self.reuse_hits = counter("reuse_hits", "requests that resumed from retained state, by kind and tier",
                                  ("kind", "tier"))
        self.reuse_hit_tokens = counter("reuse_hit_tokens", "prompt tokens resumed, by kind and tier",
                                        ("kind", "tier"))
        self.store_counters = {
            name: counter(name, doc) for name, doc in (
                ("reuse_captures", "retained entries captured"),
                ("reuse_captures_skipped", "captures skipped for want of a slot or a page"),
                ("reuse_demotions", "retained entries moved down to tierd when the device needed room"),
                ("reuse_restores", "retained entries restored from KV-RAM or KV-disk"),
                ("reuse_released", "retained entries released from the device"),
                ("reuse_stamp_refusals", "retained entries refused for another stamp"))}
        self._store_seen: dict[str, float] = {}
        self.retained_entries = gauge("retained_entries", "retained entries on the device")
        self.retained_lower_entries = gauge("retained_lower_entries", "retained entries the engine knows in tierd")
        self.retained_bytes = gauge("retained_device_bytes",
                                    "bytes the device tier holds for retained entries (pages + slot images)")
        self.retained_slots_free = gauge("retained_slots_free", "free retained slots")
        self.tierd_connected = gauge("tierd_connected", "1 while a tierd answers (0: device tier only)")
        self.live_evicting = gauge("live_evicting", "running sequences moving down a tier now")
        self.live_evictions = counter("live_evictions", "running sequences moved down a tier")
        self.live_resumes = counter("live_resumes", "evicted sequences resumed from a lower tier")
        hist = dict(labelnames=labels, registry=r, buckets=LATENCY_BUCKETS)
        self.ttft = Histogram("ignis:time_to_first_token_seconds", "arrival to first token", **hist).labels(model_name)
        self.itl = Histogram("ignis:inter_token_latency_seconds", "time between tokens of a stream",
                             **hist).labels(model_name)
        self.queue_time = Histogram("ignis:request_queue_time_seconds", "arrival to admission",
                                    **hist).labels(model_name)
        self.e2e = Histogram("ignis:e2e_request_latency_seconds", "arrival to finish", **hist).labels(model_name)

    def sync_store(self, stats: dict) -> None:
        """Advance the store's counters to its totals (the store counts; we export)."""
        for name, counter in {**self.store_counters, "live_evictions": self.live_evictions,
                              "live_resumes": self.live_resumes}.items():
            total = stats.get(f"{name}_total", 0)
            delta = total - self._store_seen.get(name, 0)
            if delta > 0:
                counter.inc(delta)
            self._store_seen[name] = total

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
