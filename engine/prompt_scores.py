"""Prompt logprobs: scoring the prompt tokens a prefill chunk passes (``SamplingParams.prompt_logprobs``).

The row of position ``q`` predicts the token at ``q + 1``: a chunk over
positions ``start .. end - 1`` scores prompt tokens ``start + 1 .. end`` (the
last of them only when it is still a prompt token: the row after the whole
prompt samples the first output token instead). Rows are the forward's
final-normed hidden states; the LM head runs on at most ``rows_per_slice`` of
them at a time, so a long chunk never holds ``[chunk, vocab]`` logits, and each
slice is reduced at once to the prompt token's logprob, its rank and the top
alternatives, exactly as a sampled token's logprobs are computed
(``engine.sampling.token_logprobs``: fp32 log-softmax of the raw logits).

``PromptScoring`` remembers per request how far its prompt is scored, so a
request recomputed after a preemption never sends a position twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignis.shared.wire import MAX_PROMPT_SCORES, PromptLogprobs, TokenLogprobs

SLICE_BYTES = 256 << 20
"""Most fp32 logits one slice of scored rows holds at once."""


@dataclass
class _Progress:
    prompt_ids: tuple[int, ...]
    top: int
    next_pos: int = 1  # the next prompt token to score


class PromptScoring:
    """The requests that score their prompt, and how far each has got."""

    def __init__(self, vocab_size: int, vocab_limit: int | None = None):
        self.vocab_limit = vocab_limit
        self.rows_per_slice = max(1, min(MAX_PROMPT_SCORES, SLICE_BYTES // (4 * vocab_size)))
        self.pending: dict[str, _Progress] = {}

    def start(self, req_id: str, prompt_ids: tuple[int, ...], top: int | None) -> None:
        """A request takes a lane: from its first start on, score its prompt if it asked (``top`` not None).
        A request resumed after a preemption keeps its progress."""
        if top is not None and req_id not in self.pending and len(prompt_ids) > 1:
            self.pending[req_id] = _Progress(tuple(prompt_ids), top)

    def release(self, req_id: str) -> None:
        self.pending.pop(req_id, None)

    def wants(self, req_id: str) -> bool:
        return req_id in self.pending

    def score(self, req_id: str, start: int, end: int, hidden: torch.Tensor, head) -> list[PromptLogprobs]:
        """Scores from a chunk over positions ``start .. end - 1`` whose final-normed rows are ``hidden``
        [end - start, H]; ``head(rows)`` gives their logits. Positions already scored are skipped."""
        p = self.pending.get(req_id)
        if p is None:
            return []
        first = max(start, p.next_pos - 1)  # rows first .. last - 1 score tokens first + 1 .. last
        last = min(end, len(p.prompt_ids) - 1)
        out = []
        for a in range(first, last, self.rows_per_slice):
            z = min(a + self.rows_per_slice, last)
            out.append(self._slice(req_id, p, a, hidden[a - start:z - start], head))
        if last >= first:
            p.next_pos = max(p.next_pos, last + 1)
        if p.next_pos >= len(p.prompt_ids):
            del self.pending[req_id]
        return out

    def _slice(self, req_id: str, p: _Progress, a: int, rows: torch.Tensor, head) -> PromptLogprobs:
        """Rows at positions ``a .. a + R - 1`` scoring tokens ``a + 1 .. a + R``."""
        with torch.inference_mode():
            logits = head(rows).float()
            if self.vocab_limit is not None and self.vocab_limit < logits.shape[-1]:
                logits[:, self.vocab_limit:] = float("-inf")
            logp = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(p.prompt_ids[a + 1:a + 1 + logp.shape[0]], dtype=torch.int64,
                                   device=logp.device)
            chosen = logp.gather(1, targets.unsqueeze(1))
            ranks = ((logp > chosen).sum(1) + 1).tolist()
            chosen = chosen.squeeze(1).tolist()
            if p.top > 0:
                vals, idx = torch.topk(logp, min(p.top, logp.shape[-1]), dim=-1)
                vals, idx = vals.tolist(), idx.tolist()
            else:
                vals = idx = [[] for _ in chosen]
        top_ids, top_lps = [], []
        for row_ids, row_vals in zip(idx, vals):
            kept = [(t, v) for t, v in zip(row_ids, row_vals) if v != float("-inf")]
            top_ids.append(tuple(t for t, _ in kept))
            top_lps.append(tuple(v for _, v in kept))
        return PromptLogprobs(id=req_id, start=a + 1, ranks=tuple(ranks),
                              logprobs=TokenLogprobs(tuple(chosen), tuple(top_ids), tuple(top_lps)))
