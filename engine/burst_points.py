"""Bursts that share a prefix no mark predicts: the first of them captures where the others diverge.

A burst of requests arriving together often shares more than its system
block: the same task preamble at the start of each user message, the same
document, the same few-shot examples. The learned-points index
(``engine.reuse.learned_points``) sees the second arrival share whole pages
with the first and gives the second a learned point there; but the first,
already queued (or still prefilling short of that point), would prefill
through it without a capture, and every sibling admitted with it would read
the prefix again.

``share_ahead``: when an arrival learns a point ``p``, the earliest request
still ahead of ``p`` (waiting, or prefilling with fewer than ``p`` tokens
computed and its next chunk not yet planned past ``p``) whose prompt starts
with the same ``p`` tokens gets ``p`` as a cut and capture point
(``Request.shared_ahead``, captured as a learned point).

``capture_ahead``: a request at the head of the queue waits while a running
request is prefilling towards a capture point it shares (past what the request
can resume now), then resumes from the capture once it is
filled. The wait is bounded by that request's prefill: once it passes the
point (captured or not: a skipped capture is a miss), the request is admitted
and computes what it must. It never reads a slot that is not filled
(``RetainedStore.pending_prefix`` holds it back the round the capture is in
flight). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections import deque

from ignis.engine.request import Request, RequestState
from ignis.engine.reuse.image_keys import walk_back


def share_ahead(point: int, req: Request, waiting: Mapping[str, deque[Request]],
                holders: Iterable[Request]) -> Request | None:
    """Give ``point`` (``req``'s learned point) to the earliest request ahead of it that shares it."""
    candidates = [r for q in waiting.values() for r in q if r.evicted is None]
    candidates += [r for r in holders if r.state is RequestState.PREFILLING]
    raw = req.prompt_ids
    tokens = req.key_prefix(point)  # images as their digests (engine.reuse.image_keys)
    best = None
    for other in candidates:
        if (other is req or other.num_computed_tokens >= point or len(other.prompt_ids) <= point
                or point in other.must_cut_at or other.prompt_ids[point - 1] != raw[point - 1]
                or walk_back(point, other.image_keys) != point):
            continue
        if other.key_prefix(point) == tokens and (best is None or other.arrival < best.arrival):
            best = other
    if best is not None:
        best.shared_ahead = tuple(sorted({*best.shared_ahead, point}))
        best.must_cut_at = tuple(sorted({*best.must_cut_at, point}))
    return best


def capture_ahead(tokens: tuple[int, ...], matched: int, holders: Iterable[Request], capture_kind) -> bool:
    """Whether a running request is prefilling towards a capture point ``req`` shares past ``matched``
    (``tokens``: ``req``'s key tokens, ``Request.key_prefix``; ``capture_kind(other, point)``: what
    ``other`` captures there, None if nothing)."""
    n = len(tokens)
    for other in holders:
        if other.state is not RequestState.PREFILLING:
            continue
        for point in other.must_cut_at:
            if (point <= matched or point >= n or other.num_computed_tokens >= point
                    or (not other.image_keys and other.salt_chunks is None
                        and other.prompt_ids[point - 1] != tokens[point - 1])
                    or capture_kind(other, point) is None):
                continue
            if other.key_prefix(point) == tokens[:point]:
                return True
    return False
