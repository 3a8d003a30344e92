"""CUDA graphs of decode rounds: one captured forward per batch-size bucket, replayed each round.

A round of decode steps only (every sequence one token, no prefill chunk) of
B <= ``max_bs`` sequences runs the graph of the smallest bucket >= B
(1, 2, 4, 8, then every multiple of 8 up to ``max_bs``). A graph reads its
inputs from static buffers that the round fills before the replay::

    input_ids, positions, seq_lens, slots, slot_mapping   [max_bs]          int64 / int32
    lane_table                                            [lanes, width]    int32, a row per lane
    page_table = lane_table[slots]                        [bucket, width]   gathered inside the graph
    cu_seqlens = 0..bucket, logits_indices = 0..bucket-1                    fixed per bucket

``width`` is the page table of the longest sequence the engine admits
(``max_model_len``). The page tables live by lane and are kept up to date
incrementally: a round copies only the pages a lane gained since the last
round (one every 64 tokens), or the whole row when another sequence took the
lane, never every sequence's whole table. A row is read only up to its
sequence's length, so what an earlier sequence left past that is never read.

Rows B..bucket-1 are padding: they decode token 0 at position 0 on the
state's scratch lane and scratch page (``ModelState.scratch_lane`` /
``scratch_page``), which the scheduler never hands out, so they write nothing
a live sequence reads. Their logits are dropped.

Capture happens once, after the warm-up (every kernel compiled), largest
bucket first, all buckets in one memory pool, for batches whose forward never
waits on the host (``capturable_batch``). A capture that fails (an op in
the forward that syncs with the host, say) leaves the engine eager and says
why (``status``); it never stops the engine.

``capture=False`` runs the same buffers through an eager forward instead of a
replay: the path the CPU tests compare with a plain batch.
"""

from __future__ import annotations

import logging

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.page_pool import PAGE_TOKENS

log = logging.getLogger("ignis.engine")


def buckets_up_to(max_bs: int) -> list[int]:
    """The batch sizes a graph is captured for: 1, 2, 4, 8, 16, 24, ... up to ``max_bs`` (always included)."""
    sizes = [b for b in (1, 2, 4) if b < max_bs] + list(range(8, max_bs, 8))
    return sorted(set(sizes + [max_bs])) if max_bs > 0 else []


def capturable_batch(model, dtype: torch.dtype, device: torch.device, wanted: int) -> int:
    """``wanted`` lowered to the most sequences whose decode forward never waits on the host (said in the log).

    Qwen3-Next's experts read a group size on the host beyond a few sequences
    where the grouped GEMM does not run (``SparseMoE.sync_free_tokens``): the
    graphs stop below that, and larger decode rounds run eagerly.
    """
    limit = model.sync_free_tokens(dtype, device)
    if limit is None or limit >= wanted:
        return wanted
    log.warning("decode CUDA graphs for up to %d sequences, not %d: above that the MoE experts read their group "
                "sizes on the host (the grouped GEMM runs in bf16 on sm90 only) and those decode rounds run eagerly",
                limit, wanted)
    return limit


class DecodeGraphs:
    def __init__(self, model, state, device: torch.device, max_bs: int, max_len: int, capture: bool = True):
        if max_bs < 1:
            raise ValueError(f"max_bs must be >= 1, got {max_bs}")
        self.model = model
        self.state = state
        self.device = torch.device(device)
        self.max_bs = max_bs
        self.width = max(1, -(-max_len // PAGE_TOKENS))
        self.buckets = buckets_up_to(max_bs)
        self.capture_on = capture
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.status = "not captured"
        dev = self.device
        pin = dev.type == "cuda"
        self._host = torch.zeros((5, max_bs), dtype=torch.int64, pin_memory=pin)  # ids, pos, lens, slots, slot_map
        lanes = state.scratch_lane + 1
        self._host_table = torch.full((lanes, self.width), state.scratch_page, dtype=torch.int32, pin_memory=pin)
        self.lane_table = torch.full((lanes, self.width), state.scratch_page, dtype=torch.int32, device=dev)
        self._known: dict[int, list[int]] = {}  # lane -> the pages its lane_table row holds
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.slots = torch.full((max_bs,), state.scratch_lane, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_bs,), state.scratch_page * PAGE_TOKENS, dtype=torch.int64, device=dev)
        self.page_table = torch.full((max_bs, self.width), state.scratch_page, dtype=torch.int32, device=dev)
        self.cu_seqlens = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(max_bs, dtype=torch.int64, device=dev)

    # ----- which rounds --------------------------------------------------------------

    def bucket_for(self, n: int) -> int | None:
        """The smallest bucket holding ``n`` decode steps, or None (too many: the round runs eagerly)."""
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def takes(self, chunks: list[SeqChunk]) -> bool:
        """Whether this round runs here: decode steps only, at most ``max_bs``, each inside the table."""
        if not chunks or len(chunks) > self.max_bs or (self.capture_on and not self.graphs):
            return False
        return all(len(c.tokens) == 1 and len(c.pages) <= self.width for c in chunks)

    # ----- buffers -----------------------------------------------------------------

    def _batch(self, bucket: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bucket], positions=self.positions[:bucket],
            cu_seqlens=self.cu_seqlens[:bucket + 1], seq_lens=self.seq_lens[:bucket], slots=self.slots[:bucket],
            page_table=self.page_table[:bucket], slot_mapping=self.slot_mapping[:bucket],
            logits_indices=self.logits_indices[:bucket], num_decodes=bucket, num_tokens=bucket)

    def _fill(self, chunks: list[SeqChunk], bucket: int) -> None:
        """Write this round's rows (and padding rows up to ``bucket``) into the static buffers."""
        host = self._host
        n = len(chunks)
        for b, c in enumerate(chunks):
            pos = c.start
            host[0, b] = c.tokens[0]
            host[1, b] = pos + c.rope_offset
            host[2, b] = pos + 1
            host[3, b] = c.slot
            host[4, b] = c.pages[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS
            self._sync_lane(c.slot, c.pages)
        if bucket > n:
            scratch = self.state.scratch_page
            host[:, n:bucket] = torch.tensor([[0], [0], [1], [self.state.scratch_lane], [scratch * PAGE_TOKENS]])
        for dst, row in zip((self.input_ids, self.positions, self.seq_lens, self.slots, self.slot_mapping), host):
            dst[:bucket].copy_(row[:bucket], non_blocking=True)

    def _sync_lane(self, lane: int, pages: list[int]) -> None:
        """Bring ``lane``'s row of the device table to ``pages``, copying only what changed."""
        known = self._known.get(lane)
        start = len(known) if known is not None and known == pages[:len(known)] else 0
        if start == len(pages):
            return
        row = self._host_table[lane]
        row[start:len(pages)] = torch.as_tensor(pages[start:], dtype=torch.int32)
        self.lane_table[lane, start:len(pages)].copy_(row[start:len(pages)], non_blocking=True)
        self._known[lane] = list(pages)

    def _gather_tables(self, bucket: int) -> None:
        """page_table[:bucket] = lane_table[slots[:bucket]] (on the device, inside the graph)."""
        torch.index_select(self.lane_table, 0, self.slots[:bucket], out=self.page_table[:bucket])

    # ----- capture and run -----------------------------------------------------------

    def capture(self) -> bool:
        """Capture every bucket's graph (CUDA); False, with ``status`` saying why, when it could not."""
        if not self.capture_on:
            self.status = "eager twin (capture off)"
            return False
        if self.device.type != "cuda":
            self.status = "off: CUDA graphs need a CUDA device"
            return False
        pool = None
        stream = torch.cuda.Stream(self.device)
        try:
            self._fill([], self.max_bs)
            for bucket in reversed(self.buckets):
                batch = self._batch(bucket)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # first calls (allocator, autotuning) stay outside the graph
                        self._gather_tables(bucket)
                        self.model(batch, self.state)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self._gather_tables(bucket)
                    out = self.model(batch, self.state)
                pool = graph.pool()
                self.graphs[bucket] = (graph, out)
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # the engine serves eagerly, and says so
            self.graphs.clear()
            self.status = f"off: capture failed: {type(exc).__name__}: {exc}"
            log.warning("decode CUDA graphs %s", self.status)
            return False
        self.status = f"on: {len(self.graphs)} graphs, batch sizes {self.buckets[0]}..{self.buckets[-1]}"
        log.info("decode CUDA graphs %s", self.status)
        return True

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Logits [len(chunks), vocab] of one decode round, rows in ``chunks`` order."""
        n = len(chunks)
        bucket = self.bucket_for(n)
        self._fill(chunks, bucket)
        if self.capture_on:
            graph, out = self.graphs[bucket]
            graph.replay()
        else:
            self._gather_tables(bucket)
            out = self.model(self._batch(bucket), self.state)
        return out[:n]

    def close(self) -> None:
        self.graphs.clear()
