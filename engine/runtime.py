"""One loaded model and everything allocated for it: pool, lanes, slots, scheduler, tier link.

The engine holds one :class:`Runtime` at a time. A model switch or an idle
unload closes it (every retained entry in every tier is freed, the shared
blocks unlinked) and a later request loads one again.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass

from ignis.engine.config import EngineConfig
from ignis.kernels.compile_watch import CompileWatch

log = logging.getLogger("ignis.engine")

LONG_CONTEXT_ENVS = ("IGNIS_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")
"""Set to 1, either lets --max-model-len pass the checkpoint's max_position_embeddings (vLLM's variable too)."""


def context_length(asked: int | None, model_positions: int, environ=None) -> int:
    """The longest sequence served: ``asked`` (--max-model-len), else the checkpoint's
    ``max_position_embeddings``. Asking for more than the model was trained on is refused (ValueError), as
    vLLM refuses it, unless one of ``LONG_CONTEXT_ENVS`` is 1 (then a warning)."""
    if asked is None:
        return model_positions
    if asked > model_positions:
        env = os.environ if environ is None else environ
        if not any(env.get(name) == "1" for name in LONG_CONTEXT_ENVS):
            raise ValueError(f"--max-model-len {asked} is more than the checkpoint's max_position_embeddings "
                             f"({model_positions}): positions past it were never trained and give wrong output; "
                             f"set {LONG_CONTEXT_ENVS[0]}=1 to serve it anyway")
        log.warning("--max-model-len %d passes the checkpoint's max_position_embeddings (%d), as %s=1 allows: "
                    "output past that position may be wrong", asked, model_positions,
                    next(name for name in LONG_CONTEXT_ENVS if env.get(name) == "1"))
    return asked


def configured_lengths(config, dirs: dict) -> dict:
    """name -> the longest sequence each served checkpoint's config allows (``context_length``, capped by
    ``--kv-pool-tokens``): a gateway's bound for a model not loaded yet (its load may cap it lower).
    A checkpoint whose config cannot be read, or refuses the length, is left out (its load says why)."""
    from ignis.engine.models.checkpoint_error import CheckpointError
    from ignis.engine.models.config import load_config

    lengths = {}
    for name, model_dir in dirs.items():
        if model_dir is None:
            continue
        try:
            bound = context_length(config.max_model_len, load_config(model_dir).max_position_embeddings)
        except (CheckpointError, OSError, ValueError):
            continue
        lengths[name] = min(bound, config.kv_pool_tokens) if config.kv_pool_tokens else bound
    return lengths


@dataclass
class Runtime:
    name: str
    runner: object
    scheduler: object
    tier_client: object
    info: dict
    vocab_size: int
    compiles: CompileWatch | None = None
    """Triton compiles after the warm-up (CUDA with Triton kernels); None: nothing compiles here."""

    @property
    def lora(self):
        """The LoRA adapters served with this model (``engine.models.lora.LoraSet``), or None."""
        return self.runner.model.lora

    def close(self) -> None:
        """Free everything: retained state here and in the lower tiers, device and host memory."""
        if self.compiles is not None:
            self.compiles.uninstall()
        self.scheduler.store.release_all()
        if self.tier_client is not None:
            # tierd drops our entries and unmaps the pool and slots before they are freed here
            if not self.tier_client.bye():
                log.warning("tierd did not confirm it let go of this engine's memory; freeing it anyway")
            self.tier_client.close()
        self.runner.close()
        self.runner = self.scheduler = None
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


def _warn_unreachable_floors(floors: dict[str, int], max_len: int, welcome) -> None:
    """A lower tier tierd offers (``welcome``: its answer to the hello; None: none yet) whose restore floor is
    more than a sequence can hold is written and never read: say so."""
    if welcome is None:
        return
    offered = {"ram": welcome.arena_bytes, "disk": welcome.disk_bytes}
    names = {"ram": ("KV-RAM", "--restore-floor-kv-ram"), "disk": ("KV-disk", "--restore-floor-kv-disk")}
    for tier, floor in floors.items():
        name, flag = names[tier]
        if offered.get(tier, 0) > 0 and floor >= max_len:  # a resume leaves at least one token to compute
            log.warning("%s %d is at least the longest sequence (%d tokens): no %s entry can be restored, so "
                        "what tierd keeps there is written and never read (a lower %s, or that tier off)",
                        flag, floor, max_len, name, flag)


def _attach_adapters(config: EngineConfig, name: str, model, adapters: list | None) -> None:
    """The default model's LoRA adapters: ``adapters`` ((name, path, required) from an
    ``engine.lora_updates.AdapterRegistry``; None: ``--lora-modules``). A required one that is bad raises
    (CheckpointError naming it, or OSError); one not required (any adapter once the engine serves) whose
    files went bad is dropped with a warning, never failing the load."""
    from ignis.shared.model_names import lora_specs, model_specs

    models = model_specs(config.model, config.served_model_name)
    if adapters is None:
        adapters = [(n, p, True) for n, p in lora_specs(config.lora_modules, [n for n, _ in models])]
    if not adapters or name != models[0][0]:
        return
    from ignis.engine.models.lora import LoraSet, read_adapter

    read = []
    for n, p, required in adapters:
        try:
            read.append(read_adapter(n, p, model, config.max_lora_rank))
        except (OSError, ValueError) as exc:  # CheckpointError is a ValueError
            if required:  # a --lora-modules adapter fails the load at start (exit code 2, one line)
                raise
            log.warning("LoRA adapter %r is dropped at this load of the model: %r", n, str(exc))
    lora = LoraSet(model, read)
    for a in lora.adapters:
        log.info("LoRA adapter %r: rank %d, scale %g, %d layers, from %r", a.name, a.rank, a.scale,
                 len(a.weights), a.path)


def load_runtime(config: EngineConfig, name: str, model_dir: str | None, kv_events=None,
                 adapters: list | None = None) -> Runtime:
    """Load one model and allocate everything it serves with (pool, lanes, slots, scheduler).
    ``kv_events``: the ``KvEventPublisher`` the retained store's block events go to (None: off);
    ``adapters``: the default model's LoRA adapters ((name, path, required),
    ``engine.lora_updates.AdapterRegistry.specs``; None: the ``--lora-modules`` ones)."""
    import torch

    from ignis.engine.memory_plan import device_budget, plan_memory
    from ignis.engine.models.build import TORCH_DTYPES, load_model
    from ignis.engine.models.state import ModelState
    from ignis.engine.grammar_lanes import grammar_lanes
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.engine.scheduler_config import scored_row_cost
    from ignis.engine.tier_port import NO_TIERS
    from ignis.engine.load_choices import kv_stamp, resolve_device, resolve_kv_format
    from ignis.shared.runtime import endpoints, ensure_runtime_dir
    from ignis.shared.tokenizer_files import tokenizer_vocab_size
    from ignis.kernels.backend import kernel_info, require_kernel_path, select_ops

    device = resolve_device(config.device)
    if model_dir is None:
        from ignis.shared.demo import ensure_demo_model
        model_dir = str(ensure_demo_model())
    torch.manual_seed(config.seed)
    ops = select_ops(torch.device(device).type)  # the kernel backend is fixed when the model is built
    require_kernel_path(ops, torch.device(device).type, config.allow_torch_fallback)  # KernelPathError
    # the drafter's tensors stay on disk unless speculative decoding uses them
    spec_k = config.speculative_tokens
    mtp_k = spec_k if config.speculative_method == "mtp" else 0  # prompt lookup needs no weights
    model, ckpt = load_model(model_dir, dtype=config.dtype, device=device, ops=ops, drafter=mtp_k > 0,
                             vision=not config.language_model_only)
    if config.language_model_only and ckpt.set_aside.get("vision"):
        log.info("vision tower of %s not loaded (--language-model-only): requests with images are refused", name)
    cfg = ckpt.config
    _attach_adapters(config, name, model, adapters)
    if mtp_k and not ckpt.has_drafter:
        raise ValueError(f"--speculative-tokens {spec_k}: {model_dir} has no drafter to speculate with "
                         f"({ckpt.drafter_note}); --speculative-method ngram drafts without one")
    idle = [f"--{n.replace('_', '-')}" for n in ("prompt_lookup_min", "prompt_lookup_max")
            if config.speculative_method != "ngram" and getattr(config, n) is not None]
    if not spec_k and config.speculative_disable_by_batch_size is not None:
        idle.append("--speculative-disable-by-batch-size")
    if idle:
        log.warning("%s given but not used: %s", ", ".join(idle),
                    "no speculative decoding (--speculative-tokens 0)" if not spec_k else
                    "the prompt-lookup window sizes go with --speculative-method ngram")
    if spec_k and not mtp_k:
        log.info("speculative decoding on: prompt lookup drafts up to %d tokens per step (n-grams of %d to %d "
                 "tokens)", spec_k, config.prompt_lookup_min, config.prompt_lookup_max)
    if ckpt.has_drafter:
        use = (f"drafting {spec_k} tokens per step" if mtp_k else
               "not used (prompt lookup drafts instead)" if spec_k else "not used (--speculative-tokens K drafts "
               "with it)")
        log.info("multi-token-prediction drafter available: %s; %s", ckpt.drafter_note, use)
    elif "mtp" in ckpt.set_aside:
        log.warning("mtp.* weights set aside: %s", ckpt.drafter_note)
    free, fraction = None, config.kv_memory_fraction
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the loader's staging blocks go back before free memory is measured
        free, total = torch.cuda.mem_get_info()
        free, fraction = device_budget(free, total, config.gpu_memory_utilization, fraction)
    device_slots = config.reuse_device_slots if config.reuse_prompt else 0
    host_slots = config.reuse_host_slots_per_lane * config.decode_lanes if config.reuse_prompt else 0
    kv_format = resolve_kv_format(config, device, cfg)
    if config.kv_cache_dtype.startswith("fp8"):
        log.warning("--kv-cache-dtype %s: ignis has no fp8 KV pages; the pool is %s (--kv-format: bf16 is exact "
                    "and holds half the tokens fp8 would, hq-e8-2b codes KV in 2.25 bits per value)",
                    config.kv_cache_dtype, kv_format)
    if spec_k and kv_format != "bf16":
        raise ValueError(f"--speculative-tokens needs --kv-format bf16, not {kv_format} (an exact window "
                         f"cannot be rolled back)")
    drafter_page_bytes = 0
    if mtp_k:
        from ignis.engine.memory_plan import kv_page_bytes

        drafter_page_bytes = kv_page_bytes(cfg, ckpt.dtype, "bf16") // max(1, len(cfg.full_layers)) \
            * ckpt.drafter_layers
    model_len = context_length(config.max_model_len, cfg.max_position_embeddings)  # refused before any allocation
    window = config.kv_exact_window if kv_format == "hq-e8-2b" else 0
    tiers_on = config.tierd_endpoint != "off"  # live eviction uses tierd with reuse off too
    staging = 1 if tiers_on else 0  # one host slot stages the images of evicted live sequences
    plan = plan_memory(cfg, ckpt.dtype, config.decode_lanes, config.kv_pool_tokens, config.kv_memory_bytes,
                       free_device_bytes=free, fraction=fraction,
                       device_slots=device_slots, host_slots=host_slots + staging, kv_format=kv_format,
                       exact_window=window, prefill_tokens=config.max_prefill_tokens_per_round,
                       drafter_page_bytes=drafter_page_bytes, speculating=bool(spec_k))
    log.info(plan.describe())
    graph_bs = min(config.cuda_graph_max_bs, plan.lanes) if device == "cuda" and not config.enforce_eager else 0
    if graph_bs:
        from ignis.engine.decode_graphs import capturable_batch

        graph_bs = capturable_batch(model, TORCH_DTYPES[ckpt.dtype], torch.device(device), graph_bs)
    state = ModelState.allocate(cfg, num_pages=plan.pages, lanes=plan.lanes, dtype=TORCH_DTYPES[ckpt.dtype],
                                device=device, kv_format=kv_format, exact_window=window, shared=tiers_on,
                                scratch=graph_bs > 0)
    state.allocate_slots(device_slots, host_slots + staging)
    max_len = min(model_len, plan.tokens)
    if config.max_model_len is not None and config.max_model_len > plan.tokens:
        log.warning("--max-model-len %d is more than the KV pool holds: a sequence is capped at %d tokens "
                    "(a larger pool: --kv-memory-fraction, --gpu-memory-utilization or --kv-pool-tokens)",
                    config.max_model_len, plan.tokens)
    if not config.enable_chunked_prefill:
        log.warning("--enable-chunked-prefill off is taken and changes nothing: a long prefill is always split "
                    "into chunks of --max-prefill-tokens-per-round (%d)", config.max_prefill_tokens_per_round)
    # the head's KV is made alongside a retained image; prompt lookup keeps nothing of its own
    stamp = f"{ckpt.structural_hash}:{kv_stamp(kv_format, window)}:drafter={1 if mtp_k else 0}"
    tiers, tier_client, staging_slot = NO_TIERS, None, None
    if tiers_on:
        from ignis.engine.tiers.wiring import connect_tiers

        tier_endpoint = config.tierd_endpoint
        if tier_endpoint == "auto":
            tier_endpoint = endpoints(ensure_runtime_dir(config.runtime_dir), config.instance).tierd
        port = connect_tiers(state, tier_endpoint, stamp, cfg.family, device_slots,
                             staging_slot=device_slots + host_slots, engine_id=config.instance,
                             timeout_s=config.tierd_timeout, backoff_s=config.tierd_retry_interval)
        if port is not None:  # else the staging slot stays unused: no live eviction without a tierd
            tiers, tier_client, staging_slot = port, port.client, port.staging_slot
    params = ckpt.weight_bytes // {"float32": 4, "bfloat16": 2, "float16": 2}[ckpt.dtype]
    floors = config.restore_floors(cfg.family, params)
    if tier_client is not None and config.reuse_prompt:
        _warn_unreachable_floors(floors, max_len, tier_client.welcome)
    sched = Scheduler(SchedulerConfig(
        decode_lanes=config.decode_lanes, num_pages=plan.pages,
        max_prefill_tokens_per_round=config.max_prefill_tokens_per_round, max_queue=config.max_queue,
        max_model_len=max_len, eos_token_ids=tuple(cfg.eos_token_ids), speculative_tokens=spec_k,
        image_token_id=ckpt.vision.image_token_id if ckpt.vision is not None else None,
        image_factor=ckpt.vision.patch_size * ckpt.vision.spatial_merge_size if ckpt.vision is not None else 32,
        capture_inside_chunks=kv_format == "bf16",
        scored_row_cost=scored_row_cost(cfg.vocab_size, cfg.hidden_size, params, cfg.tie_word_embeddings)),
        device_slots=device_slots, host_slots=host_slots, reuse=config.reuse_prompt, stamp=stamp,
        tiers=tiers, restore_floors=floors,
        evict_window_pages=config.evict_window_pages, staging_slot=staging_slot,
        learned_points=config.reuse_learned_points)
    if kv_events is not None:
        from ignis.engine.reuse.block_events import BlockLedger

        sched.store.tell_blocks(BlockLedger(sched.pool.page_tokens, kv_events.add))
    vocab_limit = tokenizer_vocab_size(model_dir)  # ids past it are never sampled
    runner = ModelRunner(model, state, device=device, vocab_limit=vocab_limit,
                         grammars=grammar_lanes(model_dir, cfg.vocab_size, cfg.eos_token_ids, device),
                         image_cache_bytes=config.image_cache_bytes)
    if mtp_k:
        from ignis.engine.models.build import drafter_from_checkpoint
        from ignis.engine.spec_decode import SpecDecoder

        runner.use_drafter(SpecDecoder(model, drafter_from_checkpoint(ckpt), state, spec_k, vocab_limit))
    elif spec_k:
        from ignis.engine.ngram_drafter import NgramDrafter

        runner.use_drafter(NgramDrafter(model, state, spec_k, config.prompt_lookup_min, config.prompt_lookup_max,
                                        vocab_limit))
    if runner.spec is not None:
        runner.spec.disable_at = config.speculative_disable_by_batch_size
    runner.warm_up()
    if config.grammar_vocab == "at-load" or (config.grammar_vocab == "auto" and device == "cuda"):
        runner.grammars.prepare()
    captured = 0
    if graph_bs:
        from ignis.engine.decode_graphs import DecodeGraphs

        graphs = DecodeGraphs(model, state, torch.device(device), graph_bs, max_len)
        if graphs.capture():
            runner.use_graphs(graphs)
            captured = len(graphs.graphs)
    info = {"kv_pool_tokens": plan.tokens, "kv_pool_bytes": plan.pool_bytes,
            "live_state_bytes": plan.live_state_bytes, "slot_bytes": plan.slot_bytes, **kernel_info(ops),
            "cuda_graphs": captured}  # decode graphs captured (0: every round eager)
    # from here on a Triton compile is a variant the warm-up missed, compiled while requests wait: counted
    compiles = CompileWatch().install() if device == "cuda" and ops.name != "reference" else None
    log.info("model %s loaded from %s", name, model_dir)
    return Runtime(name, runner, sched, tier_client, info, cfg.vocab_size, compiles)


