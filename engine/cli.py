"""``ignis engine``: load the model, print the memory plan, serve over ZeroMQ until SIGTERM."""

from __future__ import annotations

import logging
import sys

from engine.config import EngineConfig
from shared.flags import add_flags, from_args
from shared.logs import setup_logging

log = logging.getLogger("ignis.engine")


def add_arguments(parser) -> None:
    add_flags(parser, EngineConfig)


def resolve_device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return choice


def build_server(config: EngineConfig):
    """Everything the engine needs, loaded and allocated, ready to serve."""
    import torch

    from engine.memory_plan import plan_memory
    from engine.models.build import TORCH_DTYPES, load_model
    from engine.models.state import ModelState
    from engine.runner import ModelRunner
    from engine.scheduler import Scheduler, SchedulerConfig
    from engine.server import EngineServer
    from shared.model_names import served_name
    from shared.runtime import endpoints, ensure_runtime_dir

    device = resolve_device(config.device)
    model_dir = config.model
    if model_dir is None:
        from engine.demo import ensure_demo_model
        model_dir = str(ensure_demo_model())
    torch.manual_seed(config.seed)
    model, ckpt = load_model(model_dir, dtype=config.dtype, device=device)
    cfg = ckpt.config
    free = None
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
    device_slots = config.reuse_device_slots if config.reuse_prompt else 0
    host_slots = config.reuse_host_slots_per_lane * config.decode_lanes if config.reuse_prompt else 0
    kv_format = _kv_format(config, device, cfg)
    window = config.kv_exact_window if kv_format == "hq-e8-2b" else 0
    plan = plan_memory(cfg, ckpt.dtype, config.decode_lanes, config.kv_pool_tokens, config.kv_memory_bytes,
                       free_device_bytes=free, fraction=config.kv_memory_fraction,
                       device_slots=device_slots, host_slots=host_slots, kv_format=kv_format, exact_window=window)
    log.info(plan.describe())
    tiers_on = config.tierd_endpoint != "off" and config.reuse_prompt
    state = ModelState.allocate(cfg, num_pages=plan.pages, lanes=plan.lanes, dtype=TORCH_DTYPES[ckpt.dtype],
                                device=device, kv_format=kv_format, exact_window=window, shared=tiers_on)
    state.allocate_slots(device_slots, host_slots)
    max_len = min(config.max_model_len or cfg.max_position_embeddings, plan.tokens)
    sched = Scheduler(SchedulerConfig(
        decode_lanes=config.decode_lanes, num_pages=plan.pages,
        max_prefill_tokens_per_round=config.max_prefill_tokens_per_round, max_queue=config.max_queue,
        max_model_len=max_len, eos_token_ids=tuple(cfg.eos_token_ids)),
        device_slots=device_slots, host_slots=host_slots, reuse=config.reuse_prompt,
        stamp=f"{ckpt.structural_hash}:{kv_stamp(kv_format, window)}:drafter=0")
    tier_client = None
    if tiers_on:
        from engine.tiers.wiring import attach_tiers

        tier_endpoint = config.tierd_endpoint
        if tier_endpoint == "auto":
            tier_endpoint = endpoints(ensure_runtime_dir(config.runtime_dir), config.instance).tierd
        params = ckpt.weight_bytes // {"float32": 4, "bfloat16": 2, "float16": 2}[ckpt.dtype]
        tier_client = attach_tiers(sched.store, state, tier_endpoint, sched.store.stamp, cfg.family,
                                   config.restore_floors(cfg.family, params))
    vocab_limit = _tokenizer_vocab(model_dir)
    runner = ModelRunner(model, state, device=device, vocab_limit=vocab_limit)
    runner.warm_up()
    if config.endpoint:
        endpoint = config.endpoint
    else:
        endpoint = endpoints(ensure_runtime_dir(config.runtime_dir), config.instance).engine
    name = served_name(config.model, config.served_model_name)
    info = {"kv_pool_tokens": plan.tokens, "kv_pool_bytes": plan.pool_bytes,
            "live_state_bytes": plan.live_state_bytes}
    server = EngineServer(config, runner, sched, name, endpoint, vocab_size=cfg.vocab_size, info=info)
    server.tier_client = tier_client
    return server


def _kv_format(config: EngineConfig, device: str, cfg) -> str:
    """--kv-format resolved; an explicit hq-e8-2b on heads it cannot store raises ValueError."""
    from kernels.hq_e8.codec import check_shape

    try:
        check_shape(cfg.num_kv_heads, cfg.head_dim)
        fits = True
    except ValueError as exc:
        if config.kv_format == "hq-e8-2b":
            raise
        fits = False
        if device == "cuda":
            log.warning("kv format: %s; using bf16", exc)
    return config.resolved_kv_format(device, hq_fits=fits)


def kv_stamp(kv_format: str, exact_window: int) -> str:
    """The KV part of a retained entry's stamp: the format, and for hq-e8-2b the window its images hold."""
    return f"{kv_format}+w{exact_window}" if kv_format == "hq-e8-2b" else kv_format


def _tokenizer_vocab(model_dir: str) -> int | None:
    """Size of the tokenizer's vocabulary, when it is smaller than the embedding table."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "tokenizer.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    vocab = data.get("model", {}).get("vocab", {})
    ids = [int(v) for v in vocab.values()] if isinstance(vocab, dict) else []
    ids += [int(t["id"]) for t in data.get("added_tokens", []) if "id" in t]
    return max(ids) + 1 if ids else None


def run(args) -> int:
    from shared import sdnotify

    setup_logging("engine")
    try:
        config = from_args(EngineConfig, args)
        sdnotify.status("loading model")
        sdnotify.extend_timeout(600)
        server = build_server(config)
    except (ValueError, OSError) as exc:
        log.error("engine cannot start: %s", exc)
        print(f"ignis engine: {exc}", file=sys.stderr)
        return 2
    server.install_signal_handlers()
    if config.metrics_port is not None:
        port = server.metrics.serve(config.metrics_port, config.metrics_host)
        log.info("engine metrics on http://%s:%d/metrics", config.metrics_host, port)
        print(f"METRICS {port}", flush=True)
    log.info("engine serving %s on %s", server.model_name, server.endpoint)
    print(f"READY {server.endpoint}", flush=True)
    sdnotify.ready(f"serving {server.model_name}")
    watchdog = sdnotify.Watchdog(alive=server.alive).start()
    try:
        return server.serve_forever()
    finally:
        watchdog.stop()
        sdnotify.stopping()
