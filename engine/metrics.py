"""The engine's Prometheus metrics (``--metrics-port``), under the ``ignis:`` prefix.

Names follow vLLM's where the meaning matches (``VLLM_NAMES``: same suffix,
type and label names) so dashboards and cache-aware routers that read vLLM
read us too; with ``--metrics-compat vllm`` those are also exported under the
``vllm:`` prefix (``VllmNames``: the same samples under a second name).
Each engine has its own registry (``ProcessMetrics``): nothing here is
global, so several engines can live in one process in tests. Every metric is
labelled ``model_name`` first. docs/metrics.md lists them all.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from ignis.shared.process_metrics import ProcessMetrics
from ignis.shared.synced_counts import SyncedCounts

VLLM_NAMES = (
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
    "prefix_cache_hits", "prompt_tokens", "generation_tokens", "request_success", "num_preemptions",
    "time_to_first_token_seconds", "inter_token_latency_seconds", "request_queue_time_seconds",
    "e2e_request_latency_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens")
"""Engine metrics whose meaning, type and labels are vLLM's ``vllm:<name>``."""
VLLM_OLD_NAMES = {"kv_cache_usage_perc": "gpu_cache_usage_perc",
                  "inter_token_latency_seconds": "time_per_output_token_seconds"}
"""The older vLLM names of two of them, which vLLM's own example dashboard still reads: exported as well."""

TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(6) for m in (1, 2, 5)) + (1_000_000,)
"""Tokens per request: 1, 2, 5, 10, 20, 50, ... 500000, 1000000 (vLLM's 1-2-5 steps)."""


class VllmNames:
    """A collector that yields every family of ``inner`` and, for those in ``VLLM_NAMES``, a copy under ``vllm:``
    (and one under its older vLLM name, ``VLLM_OLD_NAMES``)."""

    def __init__(self, inner: CollectorRegistry, prefix: str = "ignis:"):
        self.inner = inner
        self.prefix = prefix

    def collect(self):
        for family in self.inner.collect():
            yield family
            short = family.name[len(self.prefix):] if family.name.startswith(self.prefix) else None
            if short not in VLLM_NAMES:
                continue
            for name in (short, VLLM_OLD_NAMES.get(short)):
                if name is None:
                    continue
                twin = Metric("vllm:" + name, family.documentation, family.type, family.unit)
                cut = len(self.prefix) + len(short)  # a sample's name: the family's, then _total, _bucket, ...
                twin.samples = [s._replace(name="vllm:" + name + s.name[cut:]) for s in family.samples]
                yield twin


class EngineMetrics(ProcessMetrics):
    def __init__(self, model_name: str, vllm_compat: bool = False):
        super().__init__("ignis:", "model_name", model_name)
        self.model_name = model_name
        self.running = self.gauge("num_requests_running", "requests holding a lane")
        self.waiting = self.gauge("num_requests_waiting", "requests queued for a lane, with those waiting for a "
                                  "model load or switch or for their grammar's compile")
        self.kv_usage = self.gauge("kv_cache_usage_perc", "fraction of KV pool pages in use (0..1)")
        self.pages_used = self.gauge("kv_pool_pages_used", "KV pool pages held by sequences")
        self.pages_free = self.gauge("kv_pool_pages_free", "KV pool pages free")
        self.prompt_tokens = self.counter("prompt_tokens", "prompt tokens of finished requests")
        self.prefill_tokens = self.counter("prefill_tokens", "prompt tokens actually prefilled (computed)")
        self.generation_tokens = self.counter("generation_tokens", "tokens generated")
        self.prefix_queries = self.counter("prefix_cache_queries", "prompt tokens looked up for reuse")
        self.prefix_hits = self.counter("prefix_cache_hits", "prompt tokens reused")
        self.finished = self.counter("request_success", "finished requests by finish reason", ("finished_reason",))
        self.refused = self.counter("request_refused", "requests refused by reason", ("reason",))
        self.preemptions = self.counter("num_preemptions", "running requests preempted for room")
        self.wire_errors = SyncedCounts(self.counter(
            "wire_errors", "malformed messages received, by socket (gateway, tierd, kv_events_replay)", ("socket",)),
            model_name)
        self.reuse_hits = self.counter("reuse_hits", "requests that resumed from retained state, by kind and tier",
                                       ("kind", "tier"))
        self.reuse_hit_tokens = self.counter("reuse_hit_tokens", "prompt tokens resumed, by kind and tier",
                                             ("kind", "tier"))
        self.lora_requests = self.counter("lora_requests", "requests that ran with a LoRA adapter, by adapter",
                                          ("adapter",))
        self.reuse_shortfall = self.counter(
            "reuse_shortfall", "requests that reused less than they share with an earlier prompt (or nothing), "
            "by reason: unseen, no_mark, slot_busy, evicted, tier_failed, budget, no_room, aborted, not_ready, "
            "below_floor",
            ("reason",))
        self.store_counters = {
            name: self.counter(name, doc) for name, doc in (
                ("reuse_captures", "retained entries captured"),
                ("reuse_captures_skipped", "captures skipped for want of a slot or a page"),
                ("reuse_demotions", "retained entries moved down to tierd when the device needed room (one tierd "
                                    "already held counts too: no bytes move for it)"),
                ("reuse_restores", "retained entries restored from KV-RAM or KV-disk"),
                ("reuse_released", "retained entries released from the device"),
                ("reuse_stamp_refusals", "retained entries refused for another stamp"),
                ("reuse_flushes", "cache resets: every retained entry dropped in every tier (/reset_prefix_cache, "
                                  "/flush_cache)"),
                ("reuse_tier_give_ups", "requests that stopped waiting for tierd to bring their match back (slow or "
                                        "frozen past the bound): each computed it; none waited for tierd until it "
                                        "answered again"))}
        self.tier_wait = self.histogram(
            "reuse_tier_wait_seconds", "time a request waited at the head of its queue for its match to be looked "
            "up in and copied back from KV-RAM or KV-disk")
        self.restore_rejected = self.counter(
            "reuse_restore_rejected", "restores from KV-RAM or KV-disk whose bytes were refused before use "
            "(dropped; the request recomputes), by reason: non_finite", ("reason",))
        self._store_seen: dict[str, float] = {}
        self._compiles_of = None  # the CompileWatch last synced, and its counts then
        self._compiles_seen: dict[str, tuple[int, float]] = {}
        self.retained_entries = self.gauge("retained_entries", "retained entries on the device")
        self.retained_lower_entries = self.gauge("retained_lower_entries", "retained entries the engine knows in tierd")
        self.retained_bytes = self.gauge("retained_device_bytes",
                                         "bytes the device tier holds for retained entries (pages + slot images)")
        self.retained_slots_free = self.gauge("retained_slots_free", "free retained slots")
        self.retained_slots_total = self.gauge("retained_slots_total", "retained slots reserved at load")
        self.retained_pages = self.gauge("retained_pages", "KV pool pages held by retained entries (at idle, every "
                                         "page in use is one of these)")
        self.tierd_connected = self.gauge("tierd_connected", "1 while a tierd answers (0: device tier only)")
        self.kernel_path = self.gauge(
            "kernel_path", "1 for the kernel path the loaded model runs (triton, reference or mixed: some ops on "
            "torch twins because their Triton forms failed to import), 0 for the others", ("path",))
        self.decode_graphs = self.gauge(
            "decode_cuda_graphs", "decode CUDA graphs captured at load (0: every decode round runs eager: no CUDA "
            "device, --enforce-eager, or the capture failed, which the log says)")
        self.live_evicting = self.gauge("live_evicting", "running sequences moving down a tier now")
        self.live_evictions = self.counter("live_evictions", "running sequences moved down a tier")
        self.live_resumes = self.counter("live_resumes", "evicted sequences resumed from a lower tier")
        self.live_abandoned = self.counter("live_evictions_abandoned",
                                           "live evictions abandoned (a tier refused; the sequence decoded on)")
        self.live_withdrawn = self.counter(
            "live_resumes_withdrawn", "resumes of evicted sequences that gave their reserved pages and staging "
            "slot back (to another waiting request short of pages, a higher-ranked decode short of a page, or an "
            "eviction); each resumes later")
        self.kv_events_dropped = self.counter("kv_events_dropped", "KV event batches dropped because the "
                                              "publisher's queue was full (--kv-events-endpoint)")
        self.spec_drafts = self.counter("spec_decode_num_drafts", "decode steps that verified drafted tokens")
        self.spec_draft_tokens = self.counter("spec_decode_num_draft_tokens", "tokens drafted by the drafter")
        self.spec_accepted = self.counter("spec_decode_num_accepted_tokens", "drafted tokens accepted (and kept)")
        self.spec_accepted_per_pos = self.counter(
            "spec_decode_num_accepted_tokens_per_pos", "drafted tokens accepted, by draft position (0: the first "
            "draft of a step)", ("position",))
        self.spec_undrafted = self.counter(
            "spec_decode_undrafted_requests", "requests that never draft though a drafter is in use, by reason: "
            "adapter, sampling_adjustments (penalties, logit bias, allowed ids, bad words, min_tokens, a "
            "thinking budget), grammar_logprobs", ("reason",))
        self.ttft = self.histogram("time_to_first_token_seconds", "arrival to first token")
        self.itl = self.histogram("inter_token_latency_seconds", "time between tokens of a stream")
        self.queue_time = self.histogram("request_queue_time_seconds", "arrival to admission")
        self.e2e = self.histogram("e2e_request_latency_seconds", "arrival to finish")
        self.prefill_time = self.histogram("request_prefill_time_seconds", "admission to first token")
        self.decode_time = self.histogram("request_decode_time_seconds", "first token to last token")
        self.inference_time = self.histogram("request_inference_time_seconds", "admission to last token")
        self.kernel_compiles = self.counter(
            "kernel_compiles_while_serving", "Triton kernel variants compiled after the warm-up (CUDA), each while "
            "every lane waited; each is also a warning in the log", ("kernel",))
        self.kernel_compile_seconds = self.counter(
            "kernel_compile_seconds_while_serving", "seconds those compiles took", ("kernel",))
        self.grammar_compile_seconds = self.histogram(
            "grammar_compile_seconds", "a grammar's compile off the loop (the first also builds the grammar "
            "library's vocabulary); its requests wait meanwhile, holding no lane")
        self.request_prompt = self.histogram("request_prompt_tokens", "prompt tokens per finished request",
                                             buckets=TOKEN_BUCKETS)
        self.request_generation = self.histogram("request_generation_tokens", "tokens generated per finished "
                                                 "request", buckets=TOKEN_BUCKETS)
        if vllm_compat:  # the scrape serves every family, and the vLLM-named twins of those that have one
            inner, self.registry = self.registry, CollectorRegistry()
            self.registry.register(VllmNames(inner))

    def sync_compiles(self, watch) -> None:
        """Advance the compile counters to ``watch``'s (a ``CompileWatch``; a new one, a new model, starts at 0)."""
        if watch is None:
            return
        if self._compiles_of is not watch:
            self._compiles_of, self._compiles_seen = watch, {}
        for kernel, count in watch.counts.items():
            seen = self._compiles_seen.get(kernel, (0, 0.0))
            if count > seen[0]:
                self.kernel_compiles.labels(self.model_name, kernel).inc(count - seen[0])
                self.kernel_compile_seconds.labels(self.model_name, kernel).inc(watch.seconds[kernel] - seen[1])
                self._compiles_seen[kernel] = (count, watch.seconds[kernel])

    def sync_store(self, stats: dict) -> None:
        """Advance the store's counters to its totals (the store counts; we export)."""
        for name, counter in {**self.store_counters, "live_evictions": self.live_evictions,
                              "live_resumes": self.live_resumes,
                              "live_evictions_abandoned": self.live_abandoned,
                              "live_resumes_withdrawn": self.live_withdrawn,
                              "reuse_restore_rejected": self.restore_rejected.labels(self.model_name,
                                                                                     "non_finite")}.items():
            total = stats.get(f"{name}_total", 0)
            delta = total - self._store_seen.get(name, 0)
            if delta > 0:
                counter.inc(delta)
            self._store_seen[name] = total
