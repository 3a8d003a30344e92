"""The engine's memory plan: how many KV pages and live-state lanes it allocates at load.

Pure arithmetic over the model config (no torch), so it is unit-tested alone
and printed before anything is allocated::

    pool bytes  = pages * page bytes
    page bytes  = 64 * L_full * 2 * Hkv * D * dtype bytes          (bf16: the model dtype)
                = 64 * L_full * 2 * (Hkv*D/8 + Hkv*D/64) * 2       (hq-e8-2b: 2.25 bits per value)
    live bytes  = lanes * (recurrent state + conv history [+ hq-e8-2b exact window])
    embedding   = vocab * hidden * dtype bytes
    LM head     = vocab * hidden * dtype bytes, or 0 when tied to the embedding
    logits      = lanes * vocab * (dtype bytes [+ 4, the fp32 copy the sampler reads, when dtype is not fp32])
    GDN scratch = 4 * P * Hv * (Dk + Dv) + C * Hv * Dk * Dv * (4 fp32 | 2 bf16/fp16)
                  P prefill tokens per round, C = (P + 63 * min(lanes, P)) // 64 chunks

The pool comes from ``--kv-pool-tokens`` if given, else from a byte budget:
``--kv-memory-bytes``, or on CUDA a fraction of the free device memory left
after weights, live state, retained device slots, one round's logits and
the chunked GDN prefill's scratch. With ``--gpu-memory-utilization F``
(vLLM's) the free memory counted is what exceeds (1 - F) of the device and
the pool takes all of it (``device_budget``).

At 248,320 entries and hidden 5120 (the 27B) the embedding and the untied
LM head are 2.4 GiB each in bf16. They are part of the weights, so CUDA's
free memory is measured with them already resident; the plan names them so
the figures add up. The logits are not resident at load, so the plan sets
them aside. A round's logits have one row per sampled sequence (a decode, or
a prefill ending its prompt), each on its own lane: ``lanes`` rows bound
every round, and no prefill position other than a prompt's last has a row.

The GDN scratch is what one layer's chunked prefill allocates and frees
(``kernels/gated_delta_rule/triton_chunk.chunk_scratch_bytes``, which a
kernel test holds equal to this figure): u and w in fp32, and one
chunk-start state per 64-token chunk, bf16 for a bf16/fp16 model. A round
prefills at most ``--max-prefill-tokens-per-round`` tokens, each chunk from
its own lane; its chunk count is bounded as the kernel's grid bounds it, each
sequence leaving under one chunk unused. At the 27B's Hv = 48, Dk = Dv = 128:
199 MB at 2,048 tokens over 32 lanes, 615 MB at 8,192 tokens over 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.engine.models.config import DTYPE_BYTES, PAGE_TOKENS, ModelConfig

CPU_DEFAULT_KV_BYTES = 256 << 20


@dataclass(frozen=True)
class MemoryPlan:
    pages: int
    page_bytes: int
    lanes: int
    live_state_bytes: int  # all lanes
    kv_dtype: str
    device_slots: int = 0
    host_slots: int = 0
    slot_bytes: int = 0  # one retained state image
    kv_format: str = "bf16"
    embedding_bytes: int = 0  # resident with the weights
    lm_head_bytes: int = 0  # resident with the weights; 0 when tied to the embedding
    logits_bytes: int = 0  # one round's logits at ``lanes`` rows, set aside from a free-memory budget
    gdn_scratch_bytes: int = 0  # one layer's chunked GDN prefill scratch at a full round, set aside likewise
    prefill_tokens: int = 0  # the round's prefill token budget the scratch is sized for
    spec_snapshot_bytes: int = 0  # speculative decoding: every lane's state before a verify (engine.spec_decode)

    @property
    def tokens(self) -> int:
        return self.pages * PAGE_TOKENS

    @property
    def pool_bytes(self) -> int:
        return self.pages * self.page_bytes

    def _format(self) -> str:
        """The pages' format as the log says it: ``bf16`` (the flag's name for exact pages) names its dtype."""
        if self.kv_format == "bf16":
            return f"exact pages in {self.kv_dtype} (--kv-format bf16)"
        return f"{self.kv_format}, {self.kv_dtype}"

    def describe(self) -> str:
        head = f"{self.lm_head_bytes} bytes" if self.lm_head_bytes else "tied to the embedding"
        return (f"memory plan: KV pool {self.pages} pages x {PAGE_TOKENS} tokens = {self.tokens} tokens, "
                f"{self.pool_bytes} bytes ({self.pool_bytes / 2**20:.1f} MiB, {self._format()}); "
                f"live state {self.live_state_bytes} bytes ({self.live_state_bytes / 2**20:.1f} MiB) "
                f"for {self.lanes} lanes; retained slots {self.device_slots} on the device "
                f"({self.device_slots * self.slot_bytes} bytes) + {self.host_slots} in host memory "
                f"({self.host_slots * self.slot_bytes} bytes); with the weights: embedding {self.embedding_bytes} "
                f"bytes, LM head {head}; logits {self.logits_bytes} bytes ({self.logits_bytes / 2**20:.1f} MiB) "
                f"per round for {self.lanes} rows; GDN prefill scratch {self.gdn_scratch_bytes} bytes "
                f"({self.gdn_scratch_bytes / 2**20:.1f} MiB) for {self.prefill_tokens} tokens per round"
                + (f"; speculative snapshot {self.spec_snapshot_bytes} bytes "
                   f"({self.spec_snapshot_bytes / 2**20:.1f} MiB)" if self.spec_snapshot_bytes else ""))


def kv_page_bytes(cfg: ModelConfig, dtype: str, kv_format: str = "bf16") -> int:
    if kv_format == "bf16":
        per_token = len(cfg.full_layers) * 2 * cfg.num_kv_heads * cfg.head_dim * DTYPE_BYTES[dtype]
    elif kv_format == "hq-e8-2b":
        per_token = cfg.kv_bytes_per_token(kv_format)
    else:
        raise ValueError(f"--kv-format: unknown format {kv_format!r} (bf16, hq-e8-2b)")
    return per_token * PAGE_TOKENS


def window_bytes(cfg: ModelConfig, dtype: str, exact_window: int) -> int:
    """One lane's exact window (hq-e8-2b): W keys and values per full layer, in the model dtype."""
    return len(cfg.full_layers) * 2 * exact_window * cfg.num_kv_heads * cfg.head_dim * DTYPE_BYTES[dtype]


def lane_bytes(cfg: ModelConfig, dtype: str, kv_format: str = "bf16", exact_window: int = 0) -> int:
    """One lane's live state, which is also the size of one retained image."""
    extra = window_bytes(cfg, dtype, exact_window) if kv_format == "hq-e8-2b" else 0
    return cfg.recurrent_state_bytes() + cfg.conv_state_bytes(DTYPE_BYTES[dtype]) + extra


def embedding_bytes(cfg: ModelConfig, dtype: str) -> int:
    """The token embedding table [vocab, hidden]."""
    return cfg.vocab_size * cfg.hidden_size * DTYPE_BYTES[dtype]


def lm_head_bytes(cfg: ModelConfig, dtype: str) -> int:
    """The LM head [vocab, hidden]; 0 when it is the embedding table (tied)."""
    return 0 if cfg.tie_word_embeddings else embedding_bytes(cfg, dtype)


def logits_bytes(cfg: ModelConfig, dtype: str, rows: int) -> int:
    """One round's logits on the device: the head's output [rows, vocab], and its fp32 copy unless already fp32."""
    per_value = DTYPE_BYTES[dtype] + (4 if DTYPE_BYTES[dtype] != 4 else 0)
    return rows * cfg.vocab_size * per_value


GDN_CHUNK = 64  # the chunked prefill's chunk (kernels/gated_delta_rule/triton_chunk.BT)


def gdn_scratch_bytes(cfg: ModelConfig, dtype: str, tokens: int, seqs: int) -> int:
    """One chunked GDN prefill call's device scratch for ``tokens`` tokens in at most ``seqs``
    sequences: u and w [tokens, Hv, Dk + Dv] fp32, chunk-start states [chunks, Hv, Dk, Dv] in fp32
    for an fp32 model, else bf16; 0 without linear layers or tokens."""
    if tokens <= 0 or not cfg.linear_layers:
        return 0
    seqs = max(1, min(seqs, tokens))
    hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    chunks = (tokens + (GDN_CHUNK - 1) * seqs) // GDN_CHUNK
    state_bytes = 4 if DTYPE_BYTES[dtype] == 4 else 2
    return 4 * tokens * hv * (dk + dv) + state_bytes * chunks * hv * dk * dv


# SamplerWorkspace (engine/sampling_steps.py), per vocabulary entry: four fp32 rows, an int64 sort
# permutation, a bool mask, an fp64 row and three int64 rows (the draw's ids and hashes); host memory, held for
# the runner's life.
SAMPLER_WORKSPACE_BYTES_PER_ENTRY = 4 * 4 + 8 + 1 + 8 + 3 * 8


def sampler_workspace_bytes(vocab: int) -> int:
    return vocab * SAMPLER_WORKSPACE_BYTES_PER_ENTRY


GIB = 1 << 30


def device_budget(free: int, total: int, utilization: float | None, fraction: float) -> tuple[int, float]:
    """The free device bytes the plan may count and the share of them the pool takes: CUDA's ``free``
    and ``--kv-memory-fraction``; with ``--gpu-memory-utilization`` F, (1 - F) of the ``total`` stays
    unused and the pool takes all the rest (the plan still sets aside live state, logits and scratch)."""
    if utilization is None:
        return free, fraction
    return max(0, free - round((1.0 - utilization) * total)), 1.0


def plan_memory(cfg: ModelConfig, dtype: str, lanes: int, kv_pool_tokens: int | None = None,
                kv_memory_bytes: int | None = None, free_device_bytes: int | None = None,
                fraction: float = 0.85, device_slots: int = 0, host_slots: int = 0,
                kv_format: str = "bf16", exact_window: int = 0, prefill_tokens: int = 0,
                drafter_page_bytes: int = 0, speculating: bool = False) -> MemoryPlan:
    """Pages and lanes for a model; ``free_device_bytes`` is CUDA's free memory after weights,
    ``prefill_tokens`` the most prompt tokens one round prefills, ``drafter_page_bytes`` what each
    page costs again in the drafter's own KV (``engine.spec_decode``), taken from the same budget;
    ``speculating``: a drafter keeps every lane's state (and the scratch lane's) from before each verify
    forward, set aside likewise."""
    page = kv_page_bytes(cfg, dtype, kv_format)
    image = lane_bytes(cfg, dtype, kv_format, exact_window)
    live = lanes * image
    logits = logits_bytes(cfg, dtype, lanes)
    scratch = gdn_scratch_bytes(cfg, dtype, prefill_tokens, lanes)
    snapshot = (lanes + 1) * image if speculating else 0
    if free_device_bytes is not None:
        free_device_bytes -= device_slots * image + logits + scratch + snapshot
    if kv_pool_tokens is not None:
        pages = -(-kv_pool_tokens // PAGE_TOKENS)
    else:
        if kv_memory_bytes is None:
            if free_device_bytes is None:
                kv_memory_bytes = CPU_DEFAULT_KV_BYTES
            else:
                kv_memory_bytes = int(max(0, free_device_bytes - live) * fraction)
                if page and kv_memory_bytes < page + drafter_page_bytes:
                    raise ValueError(
                        f"no room for the KV pool: {free_device_bytes / GIB:.2f} GiB of device memory are free after "
                        f"the weights, retained slots, logits and prefill scratch, and {lanes} decode lanes' live "
                        f"state takes {live / GIB:.2f} GiB ({image / 2**20:.1f} MiB a lane); lower --decode-lanes "
                        f"(--max-num-seqs) or --max-prefill-tokens-per-round, or raise --gpu-memory-utilization")
        pages = kv_memory_bytes // (page + drafter_page_bytes) if page else 0
        if pages < 1:
            raise ValueError(f"--kv-memory-bytes: {kv_memory_bytes} bytes hold no 64-token page "
                             f"({page} bytes per page)")
    if page == 0:
        pages = max(pages, 1)
    return MemoryPlan(pages=pages, page_bytes=page, lanes=lanes, live_state_bytes=live, kv_dtype=dtype,
                      device_slots=device_slots, host_slots=host_slots, slot_bytes=image, kv_format=kv_format,
                      embedding_bytes=embedding_bytes(cfg, dtype), lm_head_bytes=lm_head_bytes(cfg, dtype),
                      logits_bytes=logits, gdn_scratch_bytes=scratch, prefill_tokens=prefill_tokens,
                      spec_snapshot_bytes=snapshot)
