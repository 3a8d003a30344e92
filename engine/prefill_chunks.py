"""Prefill chunks, and the captures of the retained store that end on them.

At most one chunk per request per round; the caller keeps the round's chunks
together within ``max_prefill_tokens_per_round``.

A chunk that ends on a capture mark is captured after the forward
(``plan.captures``). One that crosses capture marks (``inside``: the pool's
format lets the forward keep a state image part way through a chunk,
``ForwardBatch``) is captured at each in the same traversal: the forward
keeps each layer's recurrent and conv state at the mark (``PrefillChunk.keeps``)
and the capture's page copies follow it. Without ``inside`` a chunk never
crosses one of the request's ``must_cut_at`` points (it ends on it, and the
next round continues from there). The end of system + tools rounded down to whole pages is a
"retained_prefix", the generation opener a "prompt_checkpoint", the start of
the newest multi-part user message's final text part a "part_boundary", and
the request's learned point a "learned_point" (where marks coincide, that
order decides). Nothing is captured while the store is disabled. A request
aborted mid-prefill leaves the tokens it reached as an "aborted_prefill"
(``capture_aborted``).

A retained prefix or learned point that requests already waiting in the
queue share (the siblings of a subagent burst, held back to resume from it)
ranks as an interactive entry, whatever class made it: it is read as soon as it is
filled, so it outranks any idle agent entry, and an agent's own checkpoint
cannot push it out before its siblings read it. Pure Python, no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace

from ignis.engine.request import Request, RequestState
from ignis.engine.reuse.image_keys import walk_back
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.schedule import PrefillChunk, RoundPlan


def add_chunk(plan: RoundPlan, req: Request, budget: int, store: RetainedStore, page_tokens: int,
              waiting: Mapping[str, deque[Request]] | None = None, inside: bool = False,
              scored_row_cost: int = 1) -> int:
    """Plan ``req``'s next chunk (and its captures: the marks it crosses when ``inside``, the one it
    ends on); returns the budget it takes: its size, or for a request scoring its prompt its size times
    ``scored_row_cost`` (a scored row also runs the LM head and a vocabulary-wide log-softmax: on a model
    whose layers are small beside its head, a chunk of scored rows took many rounds' time at once and
    stalled every other lane). ``waiting``: the queue, whose requests may be waiting to read a retained
    prefix captured here."""
    scored = scored_row_cost > 1 and req.sampling.prompt_logprobs is not None
    chunk = next_chunk(req, max(1, budget // scored_row_cost) if scored else budget, cut=not inside)
    keeps = []
    for point in req.must_cut_at:
        if point <= chunk.start or point > chunk.end:
            continue
        order = _capture(req, point, store, page_tokens, waiting)
        if order is None:
            continue
        if point < chunk.end:  # the forward keeps the image as it passes the mark
            keeps.append((point, order.slot))
            order = replace(order, kept_in_forward=True)
        plan.captures.append(order)
    plan.prefills.append(replace(chunk, keeps=tuple(keeps)) if keeps else chunk)
    return min(budget, chunk.num_tokens * scored_row_cost) if scored else chunk.num_tokens


def _capture(req: Request, point: int, store: RetainedStore, page_tokens: int,
             waiting: Mapping[str, deque[Request]] | None):
    """The capture order of ``req``'s first ``point`` tokens, if the point is a mark and the store takes it."""
    kind = capture_kind(req, point, store, page_tokens)
    if kind is None:
        return None
    tokens = req.key_prefix(point)
    claim = req.request_class
    if kind in ("retained_prefix", "learned_point") and waiting is not None and has_waiting_reader(waiting, tokens):
        claim = "interactive"
    return store.capture(tokens, req.page_table, req.lane, kind, req.request_class, req.last_is_user,
                         claim_as=claim, family=req.cache_family)


ABORT_CAPTURE_MIN_PAGES = 8
"""An aborted prefill is kept only when it got at least this many pages past the last point it could
resume from or planned a capture at (a retry recomputes less than this from there)."""


def capture_aborted(plan: RoundPlan, req: Request, store: RetainedStore, page_tokens: int) -> bool:
    """Keep what an aborted request's prefill computed, as a retained entry at the tokens it reached.

    A client that times out or is cancelled mid-prefill often sends the same prompt again, or the same
    conversation with a message more; on a long prompt the first try's work would be lost, since the
    marks it was heading for lie ahead. The lane's state is exact at the end of its last chunk, so that
    point takes an image like a mark (kind ``aborted_prefill``, ranked as the request's class), made
    before anything else in this round (``CaptureOrder.before_round``): the request's lane is free for
    this round's admissions (the scheduler holds its pages until the round is applied). Not at a point
    inside a picture, and not for a prefill that got less than ``ABORT_CAPTURE_MIN_PAGES`` pages past
    the point it resumed from or the last mark it passed. Returns whether a capture was planned."""
    n = req.num_computed_tokens
    if (not store.enabled or req.state is not RequestState.PREFILLING or n >= len(req.prompt_ids)
            or walk_back(n, req.image_keys) != n):
        return False
    covered = max([req.cached_tokens, *(p for p in req.must_cut_at if p <= n)])
    if n - covered < ABORT_CAPTURE_MIN_PAGES * page_tokens:
        return False
    order = store.capture(req.key_prefix(n), req.page_table, req.lane, "aborted_prefill", req.request_class,
                          req.last_is_user, family=req.cache_family)
    if order is None:
        return False
    plan.captures.append(replace(order, before_round=True))
    return True


def has_waiting_reader(waiting: Mapping[str, deque[Request]], prefix: tuple[int, ...]) -> bool:
    """Whether a request in the queue starts with ``prefix`` (and goes on past it)."""
    n = len(prefix)
    return any(r.num_tokens > n and r.key_prefix(n) == prefix for q in waiting.values() for r in q)


def next_chunk(req: Request, budget: int, cut: bool = True) -> PrefillChunk:
    """From the first uncomputed token: at most ``budget`` tokens, ending at the next cut point when
    ``cut`` (else crossing it)."""
    start, target = req.num_computed_tokens, req.num_tokens
    end = min(target, start + budget)
    for point in req.must_cut_at if cut else ():  # sorted: the first cut past start is the one that binds
        if point > start:
            end = min(end, point)
            break
    return PrefillChunk(req.req_id, req.lane, start, end, end == target, req.token_slice(start, end),
                        req.page_table.pages, req.image_layout)


def capture_kind(req: Request, end: int, store: RetainedStore, page_tokens: int) -> str | None:
    """What a chunk of ``req`` ending at ``end`` captures, if anything."""
    if not store.enabled or end >= len(req.prompt_ids) or end not in req.must_cut_at:
        return None
    if req.opener_start == end:
        return "prompt_checkpoint"
    if req.system_end is not None and req.system_end // page_tokens * page_tokens == end:
        return "retained_prefix"
    if req.part_end == end:
        return "part_boundary"
    if req.learned_at == end or end in req.shared_ahead:
        return "learned_point"
    return None
