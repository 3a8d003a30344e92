"""Prompt-lookup drafting: drafts copied from the request's own tokens where its last n-gram occurred before.

vLLM's ``ngram`` method (``--speculative-config '{"method": "ngram", ...}'``,
SGLang's ``NGRAM``). An agent's answer repeats much of what it was given: a
file it read, rewritten with a few lines changed; the arguments of a tool
call quoting the conversation; code it wrote two turns ago. When the last
n tokens (``prompt_lookup_max`` down to ``prompt_lookup_min``) occurred
earlier in the prompt or the output, the tokens that followed that earlier
occurrence (its most recent one, the longest n first) are the drafts. It
needs no weights and no device state: a checkpoint without a
multi-token-prediction head speculates too, and retained images are the
target's alone (the stamp's ``drafter=0``).

The drafts go through the same verify forward, acceptance and recurrent-state
rollback as the head's (``engine.spec_decode.DraftVerifier``,
``engine.spec_round``): greedy output is unchanged. A sampled request's drafts
are a point mass (the draft has probability one), so rejection sampling keeps
a draft with the target's probability of it and, on a rejection, draws from
the target with that token removed (``engine.spec_sampling``): the output
distribution is unchanged.

Each lane keeps its request's tokens (``begin``: the prompt and any output;
each round's input token and accepted tokens after it) with, for each
position, the previous position of the same token: a lookup walks the last
token's most recent occurrences (at most ``CANDIDATES``) and compares the
tokens before each, so its cost does not grow with the context.
"""

from __future__ import annotations

import numpy as np

from ignis.engine.models.state import ModelState
from ignis.engine.spec_decode import DraftAsk, DraftVerifier, HeadCatchUp
from ignis.engine.speculative_config import LOOKUP_DEFAULT


CANDIDATES = 64
"""A lookup tries the most recent earlier occurrences of the last token, at most this many: its cost is
bounded whatever the context's length (an older, longer match of a very frequent token may be missed)."""


class LaneTokens:
    """One lane's tokens so far, with each position's previous occurrence of the same token (``prev``) and
    each token's last position (``last``), in buffers that grow by doubling."""

    def __init__(self, tokens):
        toks = np.asarray(tokens, dtype=np.int64)
        n = toks.size
        self.length = n
        self.buf = np.empty(max(64, 2 * n), dtype=np.int64)
        self.prev = np.empty_like(self.buf)
        self.buf[:n] = toks
        self.last: dict[int, int] = {}
        if n:  # by sorting: one pass of numpy, not a Python loop over a long prompt
            order = np.argsort(toks, kind="stable")
            ordered = toks[order]
            same = ordered[1:] == ordered[:-1]
            prev = np.full(n, -1, dtype=np.int64)
            prev[order[1:][same]] = order[:-1][same]
            self.prev[:n] = prev
            ends = np.ones(n, dtype=bool)
            ends[:-1] = ~same
            self.last = dict(zip(ordered[ends].tolist(), order[ends].tolist()))

    def put(self, position: int, tokens) -> None:
        """``tokens`` at ``position`` on: those before ``length`` are known already, the rest are appended."""
        if position > self.length:
            raise ValueError(f"tokens at {position} would leave a gap after the {self.length} known")
        new = list(tokens)[self.length - position:]
        if not new:
            return
        end = self.length + len(new)
        if end > self.buf.size:
            size = max(2 * self.buf.size, end)
            for name in ("buf", "prev"):
                grown = np.empty(size, dtype=np.int64)
                grown[: self.length] = getattr(self, name)[: self.length]
                setattr(self, name, grown)
        last = self.last
        for i, t in enumerate(new, self.length):
            self.buf[i] = t
            self.prev[i] = last.get(t, -1)
            last[t] = i
        self.length = end

    def propose(self, min_n: int, max_n: int, k: int) -> list[int]:
        """``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
        ``min_n`` to ``max_n`` tokens (among the last token's ``CANDIDATES`` most recent occurrences),
        continued periodically when that occurrence ends fewer than ``k`` tokens before the end; [] when
        there is none."""
        n_tokens = self.length
        if n_tokens < min_n + 1 or k < 1:
            return []
        w = min(max_n, n_tokens)
        suffix = self.buf[n_tokens - w: n_tokens].tolist()[::-1]  # suffix[j]: the token j before the last
        best_n, best_end, tried = 0, -1, 0
        end = int(self.prev[n_tokens - 1])
        while end >= 0 and tried < CANDIDATES:
            before = self.buf[max(0, end - w + 1): end + 1].tolist()[::-1]
            n = 1
            while n < len(before) and before[n] == suffix[n]:
                n += 1
            if n > best_n:
                best_n, best_end = n, end
                if n == w:
                    break
            end = int(self.prev[end])
            tried += 1
        if best_n < min_n:
            return []
        follow = self.buf[best_end + 1: min(best_end + 1 + k, n_tokens)].tolist()
        # A match ending near the end leaves fewer than k tokens after it; the text it continues is then
        # periodic (period len(follow)), and what follows the drafts is the drafts again: a run of one
        # token drafts k of it, a loop of m tokens its next k.
        return [follow[i % len(follow)] for i in range(k)]


class NgramDrafter(DraftVerifier):
    """Drafts of up to ``k`` tokens per lane looked up in its request's own tokens."""

    def __init__(self, model, state: ModelState, k: int, lookup_min: int = LOOKUP_DEFAULT,
                 lookup_max: int = LOOKUP_DEFAULT, vocab_limit: int | None = None):
        super().__init__(model, state, k, vocab_limit)
        if not 1 <= lookup_min <= lookup_max:
            raise ValueError(f"prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{lookup_min} and {lookup_max}")
        self.lookup_min, self.lookup_max = lookup_min, lookup_max
        self.lanes: dict[int, LaneTokens] = {}

    def begin(self, lane: int, tokens: tuple[int, ...]) -> None:
        self.lanes[lane] = LaneTokens(tokens)

    def forget(self, lane: int) -> None:
        self.lanes.pop(lane, None)

    def keep(self, lane: int, start: int, hidden, tokens: list[int]) -> None:
        """``tokens`` follow position ``start`` (the round's accepted tokens, or a prefill chunk's)."""
        known = self.lanes.get(lane)
        if known is not None and start + 1 <= known.length:
            known.put(start + 1, tokens)  # a prefill chunk's prompt tokens are known already

    def follow(self, decodes) -> None:
        for d in decodes:
            known = self.lanes.get(d.lane)
            if known is not None and known.length >= d.position:
                known.put(d.position, (d.token_id,))

    def draft(self, asks: list[DraftAsk], catch_ups: list[HeadCatchUp]) -> dict[str, list[int]]:
        """Each ask's input token goes in at its position, then its lookup's drafts (at most its ``room``).
        A lane whose tokens are not known up to its position (none since it started) drafts nothing."""
        self.draft_probs = {}
        drafts = {}
        for a in asks:
            known = self.lanes.get(a.lane)
            if known is None or known.length < a.position:
                continue
            known.put(a.position, (a.token_id,))
            found = known.propose(self.lookup_min, self.lookup_max, min(a.room, self.k))
            if found:
                drafts[a.req_id] = found
                if a.sampler is not None:
                    self.draft_probs[a.req_id] = [None] * len(found)
        return drafts
