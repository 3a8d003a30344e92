"""The token bitmask of a round's constrained rows, and its application to their logits.

One int32 bitmask row per sampled row, 32 tokens a word, bit ``t % 32`` of
word ``t // 32`` set when token ``t`` is allowed (llguidance's layout):

    mask[row] = | w0: tokens 0..31 (bit 0 = token 0) | w1: tokens 32..63 | ... | w[W-1] |

Rows are filled by llguidance's executor for all constrained rows in one call
(its threads, without the GIL), so a round's fill can run while the forward
does. ``apply`` sets every disallowed logit of a constrained row to -inf in
place, on the logits' own device: on the CPU numpy unpacks a row's
disallowed bits to bytes and writes -inf's bit pattern through integer
operations (a masked float copy is several times slower there), rows split
over a few threads; on an
accelerator one unpack-and-fill (the mask rows are copied there from pinned
memory). Rows of unconstrained streams are never read or written.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ignis.engine.grammar_cache import GrammarCache


NEG_INF_BITS = np.int32(-8388608)  # 0xff800000: float32 -inf as an int32
APPLY_THREADS = 4


def mask_words(vocab: int) -> int:
    return (vocab + 31) // 32


def fill_disallowed(row: np.ndarray, disallowed: np.ndarray, scratch: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> None:
    """``row[t] = -inf`` where ``disallowed[t]`` is 1, in place (fp32 ``row``, uint8 0/1 ``disallowed``).

    Bitwise, on the row's int32 view: m = -disallowed is all ones where a
    token is disallowed and 0 where not, and row ^= (row ^ bits(-inf)) & m
    turns exactly those entries into -inf. ``scratch``: two int32 arrays at
    least as long as ``row``, reused so that no row allocates.
    """
    n = row.shape[0]
    m, t = (s[:n] for s in scratch) if scratch is not None else (np.empty(n, np.int32), np.empty(n, np.int32))
    bits = row.view(np.int32)
    np.negative(disallowed.view(np.int8), out=m, casting="unsafe")  # 0 or -1
    np.bitwise_xor(bits, NEG_INF_BITS, out=t)
    t &= m
    bits ^= t


class GrammarMasks:
    """The [rows, W] bitmask buffer (grown to the widest round seen) and the executor that fills it."""

    def __init__(self, cache: GrammarCache):
        import llguidance

        tok = cache.tokenizer
        self.vocab = tok.vocab_size
        self.words = mask_words(self.vocab)
        self.executor = llguidance.LLExecutor()
        self.buffer = torch.empty((0, self.words), dtype=torch.int32)
        self.eos_only = np.zeros(self.words, dtype=np.int32)  # a row allowing only the end tokens
        bits = self.eos_only.view(np.uint32)
        for t in tok.eos_tokens:
            bits[t // 32] |= np.uint32(1 << (t % 32))
        self._shifts: dict[torch.device, torch.Tensor] = {}
        # the host form splits a round's rows over a few threads (numpy lets go of the GIL), each with its scratch
        self._threads = max(1, min(APPLY_THREADS, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="grammar-apply") if self._threads > 1 else None
        self._scratch = [(np.empty(self.vocab, dtype=np.int32), np.empty(self.vocab, dtype=np.int32))
                         for _ in range(self._threads)]

    def _rows(self, n: int) -> torch.Tensor:
        if self.buffer.shape[0] < n:
            self.buffer = torch.empty((n, self.words), dtype=torch.int32, pin_memory=torch.cuda.is_available())
        return self.buffer

    def fill(self, matchers: list[tuple[object, int]], rows: int) -> torch.Tensor:
        """Fill row ``i`` for each ``(matcher, i)``; a matcher in error allows only the end tokens.

        Returns the buffer (its first ``rows`` rows hold this round's masks where filled).
        """
        buf = self._rows(rows)
        self.executor.unsafe_compute_mask_ptr(matchers, buf.data_ptr(), self.words * 4, buf.shape[0])
        arr = buf.numpy()
        for m, i in matchers:
            if m.is_error():
                arr[i] = self.eos_only
        return buf

    def apply(self, logits: torch.Tensor, buf: torch.Tensor, rows: list[int]) -> None:
        """Set the disallowed entries of ``logits[i]`` (fp32 [B, V]) to -inf for each i in ``rows``, in place."""
        vocab = min(logits.shape[-1], self.vocab)
        if logits.shape[-1] > self.vocab:  # ids the grammar's tokenizer does not have are never allowed
            logits[rows, self.vocab:] = float("-inf")
        if logits.device.type == "cpu":
            self.apply_numpy(logits, buf, rows, vocab)
        else:
            self.apply_torch(logits, buf, rows, vocab)

    def apply_numpy(self, logits: torch.Tensor, buf: torch.Tensor, rows: list[int], vocab: int) -> None:
        """The host form of ``apply`` over the first ``vocab`` ids (``logits`` on the CPU)."""
        lg = logits.numpy()
        inverted = np.invert(buf.numpy()[rows]).view(np.uint8)  # a set bit is now a disallowed token
        disallowed = np.unpackbits(inverted, axis=1, bitorder="little", count=vocab)  # [k, vocab] 0/1, one block

        def part(j: int) -> None:
            for k in range(j, len(rows), self._threads):
                fill_disallowed(lg[rows[k], :vocab], disallowed[k], self._scratch[j])

        if self._pool is None or len(rows) == 1:
            for k, i in enumerate(rows):
                fill_disallowed(lg[i, :vocab], disallowed[k], self._scratch[0])
        else:
            list(self._pool.map(part, range(self._threads)))

    def apply_torch(self, logits: torch.Tensor, buf: torch.Tensor, rows: list[int], vocab: int) -> None:
        """The device form of ``apply`` over the first ``vocab`` ids (torch ops on ``logits``' device)."""
        idx = torch.tensor(rows, dtype=torch.long)
        m8 = buf[idx].to(logits.device, non_blocking=True).view(torch.uint8)  # [k, 4W]
        shifts = self._shifts.get(logits.device)
        if shifts is None:
            shifts = self._shifts[logits.device] = torch.arange(8, dtype=torch.uint8, device=logits.device)
        bits = ((m8.unsqueeze(-1) >> shifts) & 1).reshape(len(rows), -1)[:, :vocab]  # [k, V], 1 = allowed
        didx = idx.to(logits.device)
        logits[didx, :vocab] = logits[didx, :vocab].masked_fill(bits == 0, float("-inf"))
