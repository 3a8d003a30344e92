"""The input of one model forward: a packed batch mixing decode steps and prefill chunks.

Sequences are packed back to back. Single-token decode steps come first
(``num_decodes`` of them), prefill chunks (any length, starting at any
position, continuing existing state) after them::

    tokens  : | d0 | d1 | d2 | p0 p0 p0 p0 | p1 p1 |
    seq     :   0    1    2    3             4
    cu_seqlens = [0, 1, 2, 3, 7, 9]

Each sequence names its live state lane (``slots``: index into the
recurrent/conv state pools) and its page table into the KV pool. Only the
sequences that are ``sampled`` this round (every decode, a prefill's last
chunk) have a row in ``logits_indices``: the LM head runs on those rows and
no others, so a prefill chunk that does not end its prompt costs it nothing.
"""

from __future__ import annotations

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

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

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
        ids, pos, slot_map, cu, lens, last = [], [], [], [0], [], []
        mrope = [[], [], []] if any(c.mrope is not None for c in chunks) else None
        embed_rows, embed_values = [], []
        max_pages = max(len(c.pages) for c in chunks)
        table = torch.zeros(len(chunks), max(max_pages, 1), dtype=torch.int32)
        for b, c in enumerate(chunks):
            n = len(c.tokens)
            ids.extend(c.tokens)
            positions = range(c.start, c.start + n)
            pos.extend(range(c.start + c.rope_offset, c.start + c.rope_offset + n))
            slot_map.extend(c.pages[p // PAGE_TOKENS] * PAGE_TOKENS + p % PAGE_TOKENS for p in positions)
            if mrope is not None:
                rows = c.mrope if c.mrope is not None else (pos[-n:],) * 3
                for dst, src in zip(mrope, rows):
                    dst.extend(src)
            for offset, values in c.embeds:
                embed_rows.extend(range(cu[-1] + offset, cu[-1] + offset + values.shape[0]))
                embed_values.append(values)
            cu.append(cu[-1] + n)
            lens.append(c.start + n)
            if c.sampled:
                last.append(cu[-1] - 1)
            if c.pages:
                table[b, : len(c.pages)] = torch.tensor(c.pages, dtype=torch.int32)
        dev = torch.device(device)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            slots=torch.tensor([c.slot for c in chunks], dtype=torch.int64, device=dev),
            page_table=table.to(dev),
            slot_mapping=torch.tensor(slot_map, dtype=torch.int64, device=dev),
            logits_indices=torch.tensor(last, dtype=torch.int64, device=dev),
            num_decodes=num_decodes,
            num_tokens=len(ids),
            mrope_positions=None if mrope is None else torch.tensor(mrope, dtype=torch.int64, device=dev),
            embed_rows=torch.tensor(embed_rows, dtype=torch.int64, device=dev) if embed_rows else None,
            embed_values=torch.cat(embed_values).to(dev) if embed_values else None,
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
