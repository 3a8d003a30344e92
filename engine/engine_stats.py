"""The engine's Stats reply and its Prometheus gauges, read from the loaded runtime.

A Stats reply carries the scheduler's load under vLLM's names
(``Scheduler.stats``), the pool, the limits, which model is loaded, its kernel
path (``kernel_triton_ops``, ``kernel_twin_ops``, ``kernel_fallback_ops``) and
the wire error count; with no model loaded it still carries the last model's sizes
(``ServedModels.unloaded_stats``). The gauges mirror the same numbers once per
loop turn.
"""

from __future__ import annotations

from ignis.engine.metrics import EngineMetrics
from ignis.engine.page_pool import PAGE_TOKENS


def loaded_stats(runtime, model_index: int, wire_errors: int, started_unix: float, waiting_outside: int = 0) -> dict:
    """The Stats reply while ``runtime`` is loaded; ``model_index`` is its place in the served list;
    ``waiting_outside`` requests wait before the scheduler (for another model, or for their grammar)."""
    scheduler = runtime.scheduler
    pool = scheduler.pool
    values = dict(scheduler.stats())
    values["num_requests_waiting"] += waiting_outside
    values.update({
        "pool_pages_total": pool.num_pages,
        "pool_pages_free": pool.num_free,
        "pool_pages_used": pool.num_used,
        "page_tokens": PAGE_TOKENS,
        "decode_lanes": scheduler.config.decode_lanes,
        "max_model_len": scheduler.config.max_model_len,
        "vocab_size": runtime.vocab_size,
        "wire_errors": wire_errors,
        "model_loaded": 1,
        "model_index": model_index,
        "engine_started_unix": started_unix,
    })
    values.update(runtime.info)
    if runtime.compiles is not None:  # Triton compiles after the warm-up (kernels.compile_watch)
        values["kernel_compiles_while_serving"] = sum(runtime.compiles.counts.values())
    return values


def unloaded_stats(kept: dict, waiting: int, wire_errors: int, started_unix: float) -> dict:
    """The Stats reply with no model loaded; ``waiting`` requests wait for a load."""
    return {**kept, "model_loaded": 0, "num_requests_running": 0, "num_requests_waiting": waiting,
            "wire_errors": wire_errors, "engine_started_unix": started_unix}


KERNEL_PATHS = ("triton", "reference", "mixed")


def kernel_path(info: dict) -> str:
    """The kernel path named by a runtime's info: "triton", "reference" (every op on its twin) or "mixed"."""
    if not info.get("kernel_triton_ops"):
        return "reference"
    return "mixed" if info.get("kernel_twin_ops") else "triton"


def set_gauges(metrics: EngineMetrics, runtime, waiting_outside: int, store: dict | None = None) -> None:
    """Gauges from ``runtime`` (None: no model loaded); ``waiting_outside`` requests wait before the
    scheduler (for a model load or switch, or for their grammar's compile) and count as waiting. ``store``:
    the scheduler's stats of this turn when the caller has them (``loaded_stats`` holds them all); with no
    model loaded, the sizes kept from the last one (``pool_pages_total``)."""
    if runtime is None:  # unloaded: nothing is held, in any tier (the runtime's close freed it all)
        metrics.running.set(0)
        metrics.waiting.set(waiting_outside)
        metrics.pages_used.set(0)
        metrics.pages_free.set((store or {}).get("pool_pages_total", 0))
        metrics.kv_usage.set(0)
        metrics.live_evicting.set(0)
        metrics.tierd_connected.set(0)
        for gauge in (metrics.retained_entries, metrics.retained_lower_entries, metrics.retained_pages,
                      metrics.retained_bytes, metrics.retained_slots_free, metrics.retained_slots_total):
            gauge.set(0)
        return
    scheduler = runtime.scheduler
    pool = scheduler.pool
    metrics.running.set(scheduler.num_running)
    metrics.waiting.set(scheduler.num_waiting + waiting_outside)
    metrics.pages_used.set(pool.num_used)
    metrics.pages_free.set(pool.num_free)
    metrics.kv_usage.set(pool.num_used / pool.num_pages)
    path = kernel_path(runtime.info)
    for name in KERNEL_PATHS:
        metrics.kernel_path.labels(metrics.model_name, name).set(1 if name == path else 0)
    metrics.decode_graphs.set(runtime.info.get("cuda_graphs", 0))
    store = scheduler.stats() if store is None else store
    metrics.sync_store(store)
    metrics.sync_compiles(runtime.compiles)
    metrics.live_evicting.set(store["live_evicting"])
    client = runtime.tier_client
    metrics.tierd_connected.set(1 if client is not None and client.welcome is not None else 0)
    metrics.retained_entries.set(store["retained_entries"])
    metrics.retained_lower_entries.set(store["retained_lower_entries"])
    metrics.retained_slots_free.set(store["retained_slots_free"])
    metrics.retained_slots_total.set(store["retained_slots_total"])
    metrics.retained_pages.set(store["retained_pages_held"])
    page_bytes = runtime.info.get("kv_pool_bytes", 0) // max(1, pool.num_pages)
    used_slots = store["retained_slots_total"] - store["retained_slots_free"]
    metrics.retained_bytes.set(store["retained_pages_held"] * page_bytes
                               + used_slots * runtime.info.get("slot_bytes", 0))
