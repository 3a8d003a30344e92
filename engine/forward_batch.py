"""The input of one model forward: a packed batch mixing decode steps and prefill chunks.

Sequences are packed back to back. Single-token decode steps come first
(``num_decodes`` of them), prefill chunks (any length, starting at any
position, continuing existing state) after them::

    tokens  : | d0 | d1 | d2 | p0 p0 p0 p0 | p1 p1 |
    seq     :   0    1    2    3             4
    cu_seqlens = [0, 1, 2, 3, 7, 9]

A prefill chunk that keeps state images part way (``SeqChunk.keeps``: reuse
capture marks inside it) enters as one sequence per piece between the marks,
on the same lane and page table: attention writes every token's keys and
values before it attends, so a later piece reads the earlier ones from the
pages. The linear-attention layers run their prefill sequences in waves
(``linear_waves``): wave w holds the w-th piece of each chunk (whole chunks
are in wave 0), and after it each chunk with a mark there keeps its lane's
state in the mark's slot before the next wave advances it::

    chunks  : | x x x | a a a a a a a |      keeps of a: after its 3rd token
    seqs    : | x x x | a a a | a a a a |
    wave 0  :   x x x   a a a              then keep lane(a) -> slot
    wave 1  :                   a a a a

Each sequence names its live state lane (``slots``: index into the
recurrent/conv state pools) and its page table into the KV pool. Only the
sequences that are ``sampled`` this round (every decode, a prefill's last
chunk) have a row in ``logits_indices``: the LM head runs on those rows and
no others, so a prefill chunk that does not end its prompt costs it nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ignis.engine.page_pool import PAGE_TOKENS


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a forward: ``tokens`` at positions ``start``, ``start+1``, ...

    ``sampled``: the forward returns the logits of its last token.
    """

    tokens: list[int]
    start: int
    pages: list[int]
    slot: int
    sampled: bool = True
    rope_offset: int = 0
    """Rotary position minus token index of a text token here (mRoPE: the shift of earlier images)."""
    mrope: tuple[list[int], list[int], list[int]] | None = None
    """(t, h, w) rotary positions of each token, when image tokens are among them."""
    embeds: tuple = ()
    """(offset in the chunk, rows [n, hidden]): input embeddings that replace those of tokens
    ``offset .. offset + n - 1`` (an image's embeddings over its placeholder tokens)."""
    keeps: tuple[tuple[int, int], ...] = ()
    """(position, slot): keep the lane's state image after ``position`` tokens of the sequence in
    retained ``slot`` (start < position < start + len(tokens), increasing)."""


@dataclass(frozen=True)
class LinearWave:
    """Prefill sequences the linear-attention layers advance together, and the images kept after them.

    ``rows``: their token rows, relative to the first prefill token (a slice when they are one run);
    ``cu_seqlens`` relative to the wave; ``slots``: each sequence's lane; ``keeps``: (lane, slot) pairs."""

    rows: slice | torch.Tensor
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    keeps: tuple[tuple[int, int], ...]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    slots: torch.Tensor  # [B] int64
    page_table: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64, flat KV slot of each new token
    logits_indices: torch.Tensor  # [S] int64, last token of each sampled sequence, in batch order (S <= B)
    num_decodes: int
    num_tokens: int
    _prefill_cu: torch.Tensor | None = None  # prefill_cu_seqlens(), made once per batch
    mrope_positions: torch.Tensor | None = None  # [3, T] int64 (t, h, w) when a chunk holds image tokens
    embed_rows: torch.Tensor | None = None  # [E] int64, tokens whose input embedding is replaced
    embed_values: torch.Tensor | None = None  # [E, hidden] their embeddings
    linear_waves: tuple[LinearWave, ...] | None = None  # when a chunk keeps images part way (see above)
    seq_rows: tuple[tuple[int, int, int], ...] = ()
    """(lane, first row, end row) of each chunk, on the host: which rows a lane's LoRA adapter takes
    (``engine.models.lora``)."""

    @staticmethod
    def build(chunks: list[SeqChunk], device: torch.device | str = "cpu") -> "ForwardBatch":
        if not chunks:
            raise ValueError("a forward batch needs at least one sequence")
        num_decodes = 0
        seen_prefill = False
        for c in chunks:
            if not c.tokens:
                raise ValueError("a sequence chunk needs at least one token")
            if c.start < 0:
                raise ValueError("a sequence chunk cannot start before position 0")
            if len(c.tokens) == 1 and not seen_prefill:
                num_decodes += 1
            else:
                seen_prefill = True
            end = c.start + len(c.tokens)
            if len(c.pages) * PAGE_TOKENS < end:
                raise ValueError(f"page table of {len(c.pages)} pages cannot hold {end} tokens")
        ids, pos, slot_map, cu, lens, last, slots, tables = [], [], [], [0], [], [], [], []
        mrope = [[], [], []] if any(c.mrope is not None for c in chunks) else None
        embed_rows, embed_values = [], []
        pieces = []  # per prefill sequence: (wave, row start, row end relative to the prefill), chunks with keeps
        seq_rows = []
        for c in chunks:
            n = len(c.tokens)
            base = cu[-1]
            seq_rows.append((c.slot, base, base + n))
            ids.extend(c.tokens)
            positions = range(c.start, c.start + n)
            pos.extend(range(c.start + c.rope_offset, c.start + c.rope_offset + n))
            slot_map.extend(c.pages[p // PAGE_TOKENS] * PAGE_TOKENS + p % PAGE_TOKENS for p in positions)
            if mrope is not None:
                rows = c.mrope if c.mrope is not None else (pos[-n:],) * 3
                for dst, src in zip(mrope, rows):
                    dst.extend(src)
            for offset, values in c.embeds:
                embed_rows.extend(range(base + offset, base + offset + values.shape[0]))
                embed_values.append(values)
            bounds = [0, *_keep_offsets(c), n]
            for w, (a, z) in enumerate(zip(bounds, bounds[1:])):
                cu.append(base + z)
                lens.append(c.start + z)
                slots.append(c.slot)
                tables.append(c.pages)
                if base >= num_decodes:
                    pieces.append((w, base + a - num_decodes, base + z - num_decodes))
            if c.sampled:
                last.append(cu[-1] - 1)
        max_pages = max(len(p) for p in tables)
        table = torch.zeros(len(tables), max(max_pages, 1), dtype=torch.int32)
        for b, pages in enumerate(tables):
            if pages:
                table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        dev = torch.device(device)
        waves = None
        if any(c.keeps for c in chunks):
            waves = _linear_waves(pieces, slots[len(slots) - len(pieces):], [c for c in chunks if c.keeps], dev)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            slots=torch.tensor(slots, dtype=torch.int64, device=dev),
            page_table=table.to(dev),
            slot_mapping=torch.tensor(slot_map, dtype=torch.int64, device=dev),
            logits_indices=torch.tensor(last, dtype=torch.int64, device=dev),
            num_decodes=num_decodes,
            num_tokens=len(ids),
            mrope_positions=None if mrope is None else torch.tensor(mrope, dtype=torch.int64, device=dev),
            embed_rows=torch.tensor(embed_rows, dtype=torch.int64, device=dev) if embed_rows else None,
            embed_values=torch.cat(embed_values).to(dev) if embed_values else None,
            linear_waves=waves,
            seq_rows=tuple(seq_rows),
        )

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decodes

    def prefill_cu_seqlens(self) -> torch.Tensor:
        """cu_seqlens of the prefill sequences, relative to the first prefill token (one tensor for
        every layer of the forward)."""
        if self._prefill_cu is None:
            self._prefill_cu = self.cu_seqlens[self.num_decodes:] - self.num_decodes
        return self._prefill_cu


def _keep_offsets(c: SeqChunk) -> list[int]:
    """Where ``c`` splits into pieces: its keeps' positions, relative to its start (checked)."""
    offsets = [p - c.start for p, _ in c.keeps]
    if any(not 0 < o < len(c.tokens) for o in offsets) or offsets != sorted(set(offsets)):
        raise ValueError(f"keeps {c.keeps} must be increasing positions inside the chunk "
                         f"{c.start}..{c.start + len(c.tokens)}")
    return offsets


def _linear_waves(pieces: list[tuple[int, int, int]], lanes: list[int], keeping: list[SeqChunk],
                  device: torch.device) -> tuple[LinearWave, ...]:
    """The waves of the prefill sequences (``pieces``: (wave, row start, row end) each, ``lanes`` theirs)
    and the images the ``keeping`` chunks keep after each."""
    waves = []
    for w in range(max(p[0] for p in pieces) + 1):
        runs, lens, wave_lanes = [], [], []
        for (wave, a, z), lane in zip(pieces, lanes):
            if wave != w:
                continue
            if runs and runs[-1][1] == a:
                runs[-1][1] = z
            else:
                runs.append([a, z])
            lens.append(z - a)
            wave_lanes.append(lane)
        if len(runs) == 1:
            rows = slice(*runs[0])
        else:
            rows = torch.cat([torch.arange(a, z) for a, z in runs]).to(device)
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
        keeps = tuple((c.slot, c.keeps[w][1]) for c in keeping if len(c.keeps) > w)
        waves.append(LinearWave(rows, cu, torch.tensor(wave_lanes, dtype=torch.int64, device=device), keeps))
    return tuple(waves)
