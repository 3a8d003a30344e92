"""The engine process's config: one frozen dataclass, whose fields are its CLI flags.

Some flags also answer to vLLM's and SGLang's names (``aliases``, ``shared.flags``) and a few exist
for their command lines: ``--speculative-config`` (``engine.speculative_config``),
``--gpu-memory-utilization``, ``--enforce-eager``, ``--language-model-only``, ``--log-requests``,
``--kv-cache-dtype`` (fp8 served in the ``--kv-format`` pages, with a warning), and, taken without
effect, ``--tensor-parallel-size`` and ``--data-parallel-size`` (1 only), ``--enable-lora``,
``--enable-expert-parallel``, ``--enable-chunked-prefill`` (prefill is always chunked; off is logged),
``--disable-log-stats``, ``--mm-encoder-tp-mode`` and ``--trust-remote-code`` (no code is ever run from
a checkpoint). SGLang's ``--random-seed`` is ``--seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.engine.models.config import KV_FORMATS
from ignis.engine.speculative_config import (LOOKUP_DEFAULT, METHODS, lookup_bounds, read_speculative_config,
                                             sglang_choice)
from ignis.shared.flags import field_doc, parse_bytes, parse_count, parse_optional_count
from ignis.shared.runtime import check_instance_name
from ignis.shared.model_names import DOWNLOAD_DIR_HELP, LORA_MODULES_HELP, LORA_UPDATING_HELP, SERVED_NAME_HELP, served_names


KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
"""vLLM's --kv-cache-dtype values (fp8 ones are served as bf16 pages, with a warning)."""


def _opt_bytes(text):
    return None if text in (None, "", "auto") else parse_bytes(text)


@dataclass(frozen=True)
class EngineConfig:
    model: tuple[str, ...] = field(default=(), metadata=field_doc(
        "checkpoint directory, or NAME=DIR; repeat to configure several models (the first is the default; a "
        "request naming another drains, unloads and loads it). Default: the built-in demo model", repeat=True,
        aliases=("--model-path",)))
    download_dir: str | None = field(default=None, metadata=field_doc(DOWNLOAD_DIR_HELP))
    lora_modules: tuple[str, ...] = field(default=(), metadata=field_doc(LORA_MODULES_HELP, repeat=True))
    enable_lora_updating: bool = field(default=False, metadata=field_doc(LORA_UPDATING_HELP))
    enable_lora: bool = field(default=False, metadata=field_doc(
        "taken for vLLM command lines and without effect: adapters are served whenever --lora-modules names "
        "them or --enable-lora-updating lets them be loaded"))
    max_lora_rank: int = field(default=64, metadata=field_doc(
        "the largest rank a --lora-modules adapter may have (a larger one is refused at load)"))
    idle_unload_s: float | None = field(default=None, metadata=field_doc(
        "unload the model after this many idle seconds (the next request loads it again); default: never"))
    served_model_name: tuple[str, ...] = field(default=(), metadata=field_doc(SERVED_NAME_HELP, repeat=True,
                                                                              nargs="+"))
    dtype: str | None = field(default=None, metadata=field_doc(
        "weights and activations dtype: float32, bfloat16, float16 (default: the checkpoint's on CPU, "
        "bfloat16 on CUDA)"))
    device: str = field(default="auto", metadata=field_doc(
        "cpu, cuda, or auto (cuda when available)", choices=("auto", "cpu", "cuda")))
    allow_torch_fallback: bool = field(default=False, metadata=field_doc(
        "on CUDA: serve even when an op's Triton form fails to import (or Triton itself does), running that op "
        "on its torch twin (much slower) with a WARNING naming it; off: the engine refuses to start and names "
        "the op and the import error. IGNIS_KERNELS=reference (every op on its twin, chosen) needs no flag"))
    kv_format: str = field(default="auto", metadata=field_doc(
        "KV pool format: hq-e8-2b (keys and values E8-lattice coded, 2.25 bits per value, the last "
        "--kv-exact-window tokens kept exact; 7x the tokens per byte, prefill over it slower) or bf16 (exact, "
        "in the model dtype); auto: bf16 (docs/kv-format.md)", choices=("auto", *KV_FORMATS)))
    kv_cache_dtype: str = field(default="auto", metadata=field_doc(
        "vLLM's name for the KV format: auto or bfloat16 keep --kv-format; an fp8 format is served in exact "
        "bf16 pages with a warning (ignis's compressed KV is --kv-format hq-e8-2b)"))
    kv_exact_window: int = field(default=64, metadata=field_doc(
        "hq-e8-2b: the last N tokens of each sequence whose keys and values stay exact (0: none)"))
    kv_pool_tokens: int | None = field(default=None, metadata=field_doc(
        "KV pool size in tokens (rounded up to whole 64-token pages); overrides --kv-memory-bytes"))
    kv_memory_bytes: int | None = field(default=None, metadata=field_doc(
        "KV pool budget in bytes, e.g. 512M (default: 256M on CPU; on CUDA --kv-memory-fraction of "
        "free device memory after weights)", parse=_opt_bytes))
    kv_memory_fraction: float = field(default=0.85, metadata=field_doc(
        "on CUDA without --kv-memory-bytes: fraction of free device memory after weights and live state "
        "given to the KV pool"))
    gpu_memory_utilization: float | None = field(default=None, metadata=field_doc(
        "on CUDA without --kv-memory-bytes or --kv-pool-tokens (vLLM's flag): the fraction of the device's "
        "memory this engine may fill; (1 - F) of it is left free and the KV pool takes the whole rest after "
        "weights, live state, logits and prefill scratch (instead of --kv-memory-fraction)",
        aliases=("--mem-fraction-static",)))
    decode_lanes: int = field(default=16, metadata=field_doc(
        "most sequences running at once (each holds a live recurrent state)",
        aliases=("--max-num-seqs", "--max-running-requests")))
    cpu_threads: int | None = field(default=None, metadata=field_doc(
        "threads of the engine's CPU math (torch intra-op); default: the CPUs this process may use minus one "
        "(at least 1), leaving one to the gateway and tierd: oversubscribed math threads stall on each other"))
    enforce_eager: bool = field(default=False, metadata=field_doc(
        "on CUDA: capture no CUDA graphs, every round runs eagerly (vLLM's flag; the same as "
        "--cuda-graph-max-bs 0)"))
    cuda_graph_max_bs: int = field(default=32, metadata=field_doc(
        "on CUDA: rounds of up to N decode steps (and no prefill) replay a CUDA graph captured at load for "
        "batch sizes 1, 2, 4, 8, 16, 24, ... N; larger and mixed rounds run eagerly (0: never; CPU: never)"))
    max_prefill_tokens_per_round: int = field(default=2048, metadata=field_doc(
        "prompt tokens prefilled per round, all requests together (8192, 8K or 8k)",
        aliases=("--max-num-batched-tokens", "--chunked-prefill-size"), parse=parse_count))
    image_cache_bytes: int = field(default=256 << 20, metadata=field_doc(
        "models with a vision tower: bytes of recent image embeddings kept by image content, so a repeated "
        "image is not encoded again (0: none kept)", parse=parse_bytes))
    grammar_vocab: str = field(default="auto", metadata=field_doc(
        "when the grammar library's view of the vocabulary is built (1-2 s at 248K ids, holding the "
        "interpreter lock, so every lane's rounds slow meanwhile): at-load, before the engine is ready; "
        "first-grammar, when the first constrained request arrives (an engine that never sees one never "
        "pays); auto: at-load on CUDA, first-grammar on CPU",
        choices=("auto", "at-load", "first-grammar")))
    max_queue: int = field(default=256, metadata=field_doc(
        "requests that may wait for a lane; past it new requests are refused (HTTP 429)"))
    max_model_len: int | None = field(default=None, metadata=field_doc(
        "most tokens per request, prompt + completion, e.g. 262144, 256K or 32k (default, or auto: the model's "
        "context, capped by the pool)", aliases=("--context-length",), parse=parse_optional_count))
    speculative_tokens: int = field(default=0, metadata=field_doc(
        "speculative decoding: the drafter (--speculative-method) proposes up to K tokens per decode "
        "step and the model verifies them in the same forward (requests without penalties, logit bias, allowed ids, "
        "bad words, min_tokens or thinking budget, and ones under a grammar without logprobs; greedy output is "
        "unchanged, sampled output keeps its distribution). "
        "Needs --kv-format bf16 (0: off; docs/speculative.md)"))
    speculative_method: str = field(default="mtp", metadata=field_doc(
        "the drafter of --speculative-tokens: mtp, the checkpoint's multi-token-prediction head (mtp.* weights); "
        "ngram, prompt lookup: the tokens that followed the last n-gram's most recent earlier occurrence in the "
        "request's own prompt and output (no weights; for answers that copy what they were given)",
        choices=METHODS))
    prompt_lookup_min: int | None = field(default=None, metadata=field_doc(
        "--speculative-method ngram: the shortest suffix looked up (vLLM's key; default: --prompt-lookup-max, "
        "or 5 when neither is given)"))
    prompt_lookup_max: int | None = field(default=None, metadata=field_doc(
        "--speculative-method ngram: the longest suffix looked up, tried first (default: --prompt-lookup-min, or 5)"))
    language_model_only: bool = field(default=False, metadata=field_doc(
        "serve a multimodal checkpoint's language model alone (vLLM's flag): its vision tower is not read (less "
        "device memory, a faster load) and requests with images are refused; the gateway takes the flag too"))
    speculative_config: str | None = field(default=None, metadata=field_doc(
        "vLLM's JSON form of --speculative-tokens: '{\"method\": \"mtp\", \"num_speculative_tokens\": K}' "
        "(method mtp, qwen3_next_mtp or qwen3_5_mtp: the checkpoint's own multi-token-prediction head; ngram, with "
        "prompt_lookup_min and prompt_lookup_max: prompt lookup; other drafters are refused)"))
    speculative_disable_by_batch_size: int | None = field(default=None, metadata=field_doc(
        "speculative decoding: a round with this many decoding lanes or more drafts nothing (there a decode is "
        "compute-bound and verify rows cost about what they save; vLLM's, also its disable_by_batch_size key); "
        "default: every round may draft"))
    speculative_algorithm: str | None = field(default=None, metadata=field_doc(
        "SGLang's form of the speculative flags: NEXTN, EAGLE or MTP (the checkpoint's own head; its draft tokens: "
        "--speculative-num-steps, default 3) or NGRAM (prompt lookup of --speculative-num-draft-tokens minus one, "
        "default 4, n-grams of --speculative-ngram-min/max-match-window-size, default 1 and 12); other "
        "algorithms and --speculative-eagle-topk above 1 are refused", aliases=("--speculative-algo",)))
    speculative_num_steps: int | None = field(default=None, metadata=field_doc(
        "with --speculative-algorithm NEXTN/EAGLE: draft steps, ignis's --speculative-tokens"))
    speculative_eagle_topk: int | None = field(default=None, metadata=field_doc(
        "with --speculative-algorithm: 1 only (a chain of drafts; tree drafting is not served)"))
    speculative_num_draft_tokens: int | None = field(default=None, metadata=field_doc(
        "with --speculative-algorithm: the tokens a step verifies, the one before the drafts included (NEXTN/EAGLE: "
        "steps + 1; NGRAM: its draft tokens + 1)"))
    speculative_ngram_min_match_window_size: int | None = field(default=None, metadata=field_doc(
        "with --speculative-algorithm NGRAM: --prompt-lookup-min"))
    speculative_ngram_max_match_window_size: int | None = field(default=None, metadata=field_doc(
        "with --speculative-algorithm NGRAM: --prompt-lookup-max"))
    reuse_prompt: bool = field(default=True, metadata=field_doc(
        "prompt reuse: capture retained prefixes and prompt checkpoints and resume from them (off: none)",
        aliases=("--enable-prefix-caching",), off_aliases=("--no-enable-prefix-caching", "--disable-radix-cache")))
    reuse_learned_points: bool = field(default=True, metadata=field_doc(
        "with --reuse-prompt on: also capture where a prompt diverges from a recent one past its marks "
        "(docs/reuse.md, learned points)"))
    reuse_device_slots: int = field(default=0, metadata=field_doc(
        "retained state slots reserved on the device (faster to claim than a host slot, but an entry in "
        "one is dropped, not moved to KV-RAM or KV-disk, when its pages are needed)"))
    reuse_host_slots_per_lane: int = field(default=2, metadata=field_doc(
        "retained state slots per decode lane, reserved in one pinned host block"))
    tierd_endpoint: str = field(default="off", metadata=field_doc(
        "tierd that takes retained state and evicted live sequences (also with --reuse-prompt off): an "
        "endpoint, 'auto' (this instance's tierd socket in the runtime dir), or off"))
    tierd_timeout: float = field(default=10.0, metadata=field_doc(
        "seconds a tierd exchange may stay unanswered before tierd counts as lost: the exchanges in flight "
        "fail (cache misses), the lower tiers are off and the engine serves on without them"))
    tierd_retry_interval: float = field(default=5.0, metadata=field_doc(
        "seconds between the engine's hellos to a lost tierd; the first one answered reconnects the lower "
        "tiers (with every entry tierd held before dropped, the device's kept)"))
    restore_floor_kv_ram: int | None = field(default=None, metadata=field_doc(
        "a KV-RAM match is restored only if it reuses at least this many more prompt tokens than the best "
        "match above it (default: 1024, or 64 for models under 1B parameters)"))
    restore_floor_kv_disk: int | None = field(default=None, metadata=field_doc(
        "the same for KV-disk (default: 16384 for the Qwen3.5 dense family, 8192 for Qwen3-Next)"))
    evict_window_pages: int = field(default=16, metadata=field_doc(
        "live eviction (with a tierd): pages of a lower-ranked running sequence moved down per round while "
        "the other lanes keep generating"))
    runtime_dir: str | None = field(default=None, metadata=field_doc(
        "directory of the ipc sockets (default: $XDG_RUNTIME_DIR/ignis or /tmp/ignis-$UID)"))
    instance: str = field(default="default", metadata=field_doc(
        "instance name; socket names and metrics are per instance"))
    endpoint: str | None = field(default=None, metadata=field_doc(
        "ZeroMQ endpoint the engine binds for gateways (default: ipc://RUNTIME_DIR/INSTANCE-engine.sock; "
        "tcp://HOST:PORT for split hosts, on a trusted network only: ZeroMQ takes no credentials, and a bind "
        "beyond loopback is warned about)"))
    metrics_port: int | None = field(default=None, metadata=field_doc(
        "serve the engine's Prometheus metrics on this port (0 picks a free one; default: off)"))
    metrics_host: str = field(default="127.0.0.1", metadata=field_doc("address of the metrics endpoint"))
    metrics_compat: str = field(default="off", metadata=field_doc(
        "vllm: also export every metric that has a vLLM equivalent under the vllm: prefix (same name, type and "
        "labels), for dashboards and routers that read vLLM's (docs/metrics.md)", choices=("off", "vllm")))
    kv_events_endpoint: str = field(default="off", metadata=field_doc(
        "publish KV block events of retained entries in vLLM's wire format (ZeroMQ PUB, msgpack KVEventBatch) "
        "on this endpoint, e.g. tcp://*:5557 (binds; tcp://HOST:PORT without a wildcard connects) or ipc://PATH; "
        "off: nothing is bound (docs/scale-out.md)"))
    kv_events_replay_endpoint: str | None = field(default=None, metadata=field_doc(
        "with --kv-events-endpoint: bind a ROUTER socket here that resends recent batches from a given "
        "sequence number, e.g. tcp://*:5558 (default: no replay)"))
    kv_events_topic: str = field(default="", metadata=field_doc(
        "with --kv-events-endpoint: the topic frame of every KV events message (default: empty)"))
    shutdown_timeout: float = field(default=30.0, metadata=field_doc(
        "on SIGTERM: seconds to let in-flight requests finish before aborting them"))
    watchdog_timeout: float = field(default=300.0, metadata=field_doc(
        "abort the engine (every thread's stack in the log) when its loop stays this many seconds in one turn "
        "(a hung kernel or device sync), so ignis serve or systemd restarts it; a model load gets 600 s more; "
        "ignis serve gives the gateway's event loop the same value; 0: off (SGLang's flag; shared.loop_watchdog)"))
    log_requests: bool = field(default=True, metadata=field_doc(
        "log a done line per request at INFO (off: at DEBUG, as vLLM's --disable-log-requests; the metrics still "
        "count every request). Done lines hold counts and timings, never prompt or output text",
        aliases=("--enable-log-requests",), off_aliases=("--disable-log-requests",)))
    profile_dir: str | None = field(default=None, metadata=field_doc(
        "take POST /start_profile and /stop_profile (vLLM's): the torch profiler over served rounds, its Chrome "
        "trace and a table of the top operators written into this directory (default: off; engine.profiling)"))
    seed: int = field(default=0, metadata=field_doc("seed of the engine's own generator (unseeded requests)",
                                                    aliases=("--random-seed",)))
    tensor_parallel_size: int = field(default=1, metadata=field_doc(
        "devices one model is split over (vLLM's flag): ignis runs a model on one device per engine, so only 1 "
        "is taken; for more throughput run an engine per device (docs/scale-out.md)",
        aliases=("-tp", "--tp-size", "--tp")))
    data_parallel_size: int = field(default=1, metadata=field_doc(
        "engines serving one model side by side (vLLM's flag): one engine per process here, so only 1 is taken; "
        "run an engine per device behind a router instead (docs/scale-out.md)", aliases=("-dp", "--dp-size", "--dp")))
    enable_expert_parallel: bool = field(default=False, metadata=field_doc(
        "taken for vLLM command lines and without effect: a model runs on one device, which holds all its experts"))
    enable_chunked_prefill: bool = field(default=True, metadata=field_doc(
        "taken for vLLM command lines: ignis always splits a long prefill into chunks of "
        "--max-prefill-tokens-per-round that share rounds with decodes; off is logged and changes nothing",
        off_aliases=("--no-enable-chunked-prefill",)))
    disable_log_stats: bool = field(default=False, metadata=field_doc(
        "taken for vLLM command lines and without effect: the engine logs no periodic throughput lines (its "
        "figures are on --metrics-port)"))
    mm_encoder_tp_mode: str = field(default="weights", metadata=field_doc(
        "taken for vLLM command lines and without effect: the vision encoder runs on the engine's one device",
        choices=("weights", "data")))
    trust_remote_code: bool = field(default=False, metadata=field_doc(
        "taken for vLLM command lines and without effect: ignis never runs code from a checkpoint (the "
        "architectures it serves are its own)"))
    gateway_silence_timeout: float = field(default=3.0, metadata=field_doc(
        "abort the requests of a gateway that heartbeats (asks for stats every second) once it has been silent "
        "this many seconds (0: only a gateway whose connection is gone loses its requests)"))

    def _take_speculative_config(self, choice, flag: str = "--speculative-config") -> None:
        """``flag``'s choice (vLLM's JSON, SGLang's flags), which the plain flags, where given, must agree with."""
        if self.speculative_tokens not in (0, choice.tokens):
            raise ValueError(f"{flag} asks for {choice.tokens} draft tokens and --speculative-tokens for "
                             f"{self.speculative_tokens}")
        if self.speculative_method != "mtp" and self.speculative_method != choice.method:
            raise ValueError(f"{flag} asks for method {choice.method} and --speculative-method for "
                             f"{self.speculative_method}")
        for name, value in (("prompt_lookup_min", choice.lookup_min), ("prompt_lookup_max", choice.lookup_max),
                            ("speculative_disable_by_batch_size", choice.disable_by_batch_size)):
            given = getattr(self, name)
            if value is not None and given is not None and given != value:
                raise ValueError(f"{flag} asks for {name} {value} and --{name.replace('_', '-')} for {given}")
            if value is not None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "speculative_tokens", choice.tokens)
        object.__setattr__(self, "speculative_method", choice.method)

    def __post_init__(self):
        positive = {"decode_lanes": "--decode-lanes", "max_prefill_tokens_per_round": "--max-prefill-tokens-per-round",
                    "max_queue": "--max-queue", "max_lora_rank": "--max-lora-rank"}
        for name, flag in positive.items():
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        if self.speculative_config is not None:
            self._take_speculative_config(read_speculative_config(self.speculative_config))
        sglang = (self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens,
                  self.speculative_ngram_min_match_window_size, self.speculative_ngram_max_match_window_size)
        if self.speculative_algorithm is not None:
            if self.speculative_config is not None:
                raise ValueError("--speculative-algorithm (SGLang's) and --speculative-config (vLLM's) say the "
                                 "same thing: give one")
            self._take_speculative_config(sglang_choice(self.speculative_algorithm, *sglang),
                                          flag="--speculative-algorithm")
        elif any(v is not None for v in sglang):
            raise ValueError("--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens and "
                             "the ngram window sizes go with --speculative-algorithm")
        if type(self.speculative_tokens) is not int or not 0 <= self.speculative_tokens <= 16:
            raise ValueError(f"--speculative-tokens must be an integer from 0 to 16, got {self.speculative_tokens!r}")
        if self.speculative_method not in METHODS:
            raise ValueError(f"--speculative-method must be one of {', '.join(METHODS)}, got "
                             f"{self.speculative_method!r}")
        for name in ("prompt_lookup_min", "prompt_lookup_max", "speculative_disable_by_batch_size"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.speculative_method == "ngram":
            low, high = lookup_bounds(self.prompt_lookup_min, self.prompt_lookup_max, LOOKUP_DEFAULT)
            if low > high:
                raise ValueError(f"--prompt-lookup-min {low} is above --prompt-lookup-max {high}")
            object.__setattr__(self, "prompt_lookup_min", low)
            object.__setattr__(self, "prompt_lookup_max", high)
        for name, flag in (("kv_pool_tokens", "--kv-pool-tokens"), ("kv_memory_bytes", "--kv-memory-bytes"),
                           ("max_model_len", "--max-model-len")):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        for name, flag in (("restore_floor_kv_ram", "--restore-floor-kv-ram"),
                           ("restore_floor_kv_disk", "--restore-floor-kv-disk")):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{flag} must be an integer >= 0, got {value!r}")
        if type(self.evict_window_pages) is not int or self.evict_window_pages < 1:
            raise ValueError(f"--evict-window-pages must be a positive integer, got {self.evict_window_pages!r}")
        for name, flag in (("reuse_device_slots", "--reuse-device-slots"),
                           ("reuse_host_slots_per_lane", "--reuse-host-slots-per-lane"),
                           ("image_cache_bytes", "--image-cache-bytes")):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{flag} must be an integer >= 0, got {value!r}")
        if self.cpu_threads is not None and (type(self.cpu_threads) is not int or self.cpu_threads < 1):
            raise ValueError(f"--cpu-threads must be a positive integer, got {self.cpu_threads!r}")
        if type(self.cuda_graph_max_bs) is not int or self.cuda_graph_max_bs < 0:
            raise ValueError(f"--cuda-graph-max-bs must be an integer >= 0, got {self.cuda_graph_max_bs!r}")
        if type(self.kv_exact_window) is not int or self.kv_exact_window < 0:
            raise ValueError(f"--kv-exact-window must be an integer >= 0, got {self.kv_exact_window!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size != 1:
            raise ValueError(f"--tensor-parallel-size {self.tensor_parallel_size}: ignis runs a model on one device "
                             f"per engine (only 1 is taken); for more throughput run an engine per device "
                             f"(docs/scale-out.md)")
        if self.data_parallel_size != 1:
            raise ValueError(f"--data-parallel-size {self.data_parallel_size}: an engine serves one model on one "
                             f"device (only 1 is taken); run an engine per device behind a router "
                             f"(docs/scale-out.md)")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError(f"--kv-memory-fraction must be in (0, 1], got {self.kv_memory_fraction}")
        for name, flag in (("tierd_timeout", "--tierd-timeout"), ("tierd_retry_interval", "--tierd-retry-interval")):
            value = getattr(self, name)
            if type(value) not in (int, float) or not value > 0:
                raise ValueError(f"{flag} must be seconds > 0, got {value!r}")
        if self.idle_unload_s is not None and not self.idle_unload_s > 0:
            raise ValueError(f"--idle-unload-s must be > 0, got {self.idle_unload_s}")
        check_instance_name(self.instance, "--instance")
        object.__setattr__(self, "served_model_name", served_names(self.served_model_name))
        if isinstance(self.model, str):
            object.__setattr__(self, "model", (self.model,))
        if self.model is None:
            object.__setattr__(self, "model", ())
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if not self.watchdog_timeout >= 0:
            raise ValueError(f"--watchdog-timeout must be seconds >= 0 (0: off), got {self.watchdog_timeout}")
        if not self.gateway_silence_timeout >= 0:
            raise ValueError(f"--gateway-silence-timeout must be >= 0, got {self.gateway_silence_timeout}")
        if self.metrics_compat not in ("off", "vllm"):
            raise ValueError(f"--metrics-compat must be off or vllm, got {self.metrics_compat!r}")
        if self.kv_events_replay_endpoint and self.kv_events_endpoint in ("", "off"):
            raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics-port must be in 0..65535, got {self.metrics_port}")

    def restore_floors(self, family: str, parameters: int) -> dict[str, int]:
        """Restore floors in tokens, by tier: the flags, or defaults by family and size.

        A restore from KV-RAM costs a host-to-device copy of the entry; below
        about a thousand tokens of extra reuse that copy and the bookkeeping
        are not worth it on the real models. A tiny model prefills so fast
        that the same reasoning puts its floor at one page.
        """
        ram = self.restore_floor_kv_ram
        if ram is None:
            ram = 64 if parameters < 1_000_000_000 else 1024
        disk = self.restore_floor_kv_disk
        if disk is None:
            disk = 8192 if family == "qwen3_next" else 16384
        return {"ram": ram, "disk": disk}

    def resolved_cpu_threads(self) -> int:
        """--cpu-threads, or the default (``default_cpu_threads``)."""
        if self.cpu_threads is not None:
            return self.cpu_threads
        return default_cpu_threads()

    def resolved_kv_format(self, device: str) -> str:
        """The pool format on a resolved device ("cpu" or "cuda"): --kv-format, auto being bf16 (on an
        H200 the hq-e8-2b prefill kernels run an order of magnitude slower than bf16's: docs/gpu.md)."""
        return "bf16" if self.kv_format == "auto" else self.kv_format


def default_cpu_threads() -> int:
    """The CPUs this process may run on minus one (at least 1): the engine's math threads by default."""
    import os

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        usable = os.cpu_count() or 1
    return max(1, usable - 1)
