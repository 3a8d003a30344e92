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
each round's input token and accepted tokens after it) in a growing numpy
array; a lookup is one vectorised scan for the last token, then narrowing by
the tokens before it.
"""

from __future__ import annotations

import numpy as np

from ignis.engine.models.state import ModelState
from ignis.engine.spec_decode import DraftAsk, DraftVerifier, HeadCatchUp
from ignis.engine.speculative_config import LOOKUP_DEFAULT


def propose(tokens: np.ndarray, length: int, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
    ``tokens[:length]`` of ``min_n`` to ``max_n`` tokens; [] when there is none."""
    if length < min_n + 1 or k < 1:
        return []
    seq = tokens[:length]
    ends = np.flatnonzero(seq[: length - 1] == seq[length - 1])  # earlier positions of the last token
    best = ends if min_n <= 1 else None
    n = 1
    while n < max_n and n < length and ends.size:
        before = ends - n
        keep = before >= 0
        ends, before = ends[keep], before[keep]
        ends = ends[seq[before] == seq[length - 1 - n]]
        n += 1
        if ends.size and n >= min_n:
            best = ends
    if best is None or best.size == 0:
        return []
    start = int(best[-1]) + 1
    return seq[start: min(start + k, length)].tolist()


class LaneTokens:
    """One lane's tokens so far, in a buffer that grows by doubling."""

    def __init__(self, tokens):
        self.length = len(tokens)
        self.buf = np.empty(max(64, 2 * self.length), dtype=np.int64)
        self.buf[: self.length] = tokens

    def put(self, position: int, tokens) -> None:
        """``tokens`` at ``position`` on (``position`` at most ``length``: no gap)."""
        end = position + len(tokens)
        if end > self.buf.size:
            grown = np.empty(max(2 * self.buf.size, end), dtype=np.int64)
            grown[: self.length] = self.buf[: self.length]
            self.buf = grown
        self.buf[position: end] = tokens
        self.length = max(self.length, end)


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
        if known is None or start + 1 > known.length:
            return
        new = known.length - (start + 1)  # those before are known already (a prefill chunk's prompt tokens)
        if new < len(tokens):
            known.put(known.length, tokens[new:])

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
            found = propose(known.buf, known.length, self.lookup_min, self.lookup_max, min(a.room, self.k))
            if found:
                drafts[a.req_id] = found
                if a.sampler is not None:
                    self.draft_probs[a.req_id] = [None] * len(found)
        return drafts
