"""Continuous batching: which requests hold lanes and pages, and what each round computes.

Pure Python, no torch; the runner sees only ``engine.schedule`` dataclasses.
This module owns the requests and the round; its parts live beside it:

- ``engine.decode_lanes``: lanes (slot indices into the model's live recurrent
  state, lowest free first). A running request holds one lane and a page table
  (``SequencePages``) over the ``PagePool``.
- ``engine.admission``: which waiting requests take a lane, with reuse lookups.
- ``engine.preemption``: decodes under page pressure, preemption by recompute,
  live eviction.
- ``engine.prefill_chunks``: chunk boundaries and the captures they end on.
- ``engine.reuse.learned_points``: the index of recent prompts; ``add`` plans a
  request's learned point (an extra cut) where it diverges from one of them.

A round (``schedule``): replies from tierd are taken (``TierPort.poll``, no
blocking: demotes that landed free their pages, restores that landed become
resume points), requests aborted while running are freed, evicting
sequences move one window, every decoding request gets its decode, running
prefills get a chunk each in rank order within the round's prefill budget,
then new requests are admitted (not in a round that preempted); with no lane
left, the head of the queue may start a live eviction.

Finish. ``update`` decides: a stop token (``stop_token_ids``, or the model's EOS
unless ``ignore_eos``) ends with "stop" and is part of the output; reaching
``max_tokens`` or ``max_model_len`` tokens ends with "length".

Abort. A waiting request leaves at once (``abort`` returns its FinishEvent). A
running one is marked; a round in flight may still compute it (its token is
dropped by ``update``), and it is freed at the next round boundary: the next
``schedule`` frees its lane and pages and lists it in ``plan.finished``.
A request the runner reports in ``RoundResult.errors`` (its sampling failed)
ends the same way, with "error".
"""

from __future__ import annotations

import time

from collections import deque
from dataclasses import dataclass, replace
from operator import attrgetter

from ignis.engine.admission import admit, end_tier_wait
from ignis.engine.burst_points import share_ahead
from ignis.engine.cache_flushes import requests_in_flight
from ignis.engine.decode_lanes import DecodeLanes
from ignis.engine.eviction import Evictor
from ignis.engine.image_layout import image_layout
from ignis.engine.page_pool import PagePool
from ignis.engine.preemption import evict_windows, maybe_evict, plan_decodes, preempt_for_head, waiting_head
from ignis.engine.prefill_chunks import add_chunk, capture_aborted
from ignis.engine.reuse.image_keys import ImageKey, walk_back
from ignis.engine.scheduler_config import SchedulerConfig
from ignis.engine.request import REQUEST_CLASSES, Request, RequestState
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.learned_points import LearnedPoints
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.schedule import FinishEvent, RoundPlan, RoundResult
from ignis.engine.sequence_pages import SequencePages
from ignis.engine.tier_port import NO_TIERS, TierPort
from ignis.shared.wire_fields import MAX_TOKEN_ID


@dataclass(frozen=True)
class Refusal:
    """Why ``add`` did not queue a request; ``reason`` is a wire refusal code."""

    reason: str  # "too_long" | "queue_full" | "bad_request"
    message: str


class Scheduler:
    """Owns the waiting queues, the lanes and the page pool's live sequences.

    ``tiers`` is the one port to the lower tiers, shared by the store and the
    evictor (``NO_TIERS``: none); ``restore_floors`` are the store's, per tier;
    ``staging_slot`` is the evictor's (None: no live eviction); ``learned_points``: keep the
    index of recent prompts and capture where a new one diverges (``engine.reuse.learned_points``)."""

    def __init__(self, config: SchedulerConfig, device_slots: int = 0, host_slots: int = 0, reuse: bool = True,
                 stamp: str = "", tiers: TierPort = NO_TIERS, restore_floors: dict[str, int] | None = None,
                 evict_window_pages: int = 16, staging_slot: int | None = None, learned_points: bool = True):
        if not isinstance(config, SchedulerConfig):
            raise TypeError("Scheduler needs a SchedulerConfig")
        self.config = config
        self.pool = PagePool(config.num_pages, config.page_tokens)
        self.store = RetainedStore(self.pool, SlotPool(device_slots, host_slots), enabled=reuse, stamp=stamp,
                                   tiers=tiers, restore_floors=restore_floors)
        self.tiers = tiers
        self.evictor = Evictor(tiers, evict_window_pages, staging_slot)
        self.learned = LearnedPoints(config.page_tokens) if learned_points and self.store.enabled else None
        self.waiting: dict[str, deque[Request]] = {c: deque() for c in REQUEST_CLASSES}  # in admission order
        self.lanes = DecodeLanes(config.decode_lanes, self.pool)
        self._requests: dict[str, Request] = {}  # every live (not finished) request
        self._in_flight: RoundPlan | None = None
        self._held_pages: list[SequencePages] = []  # aborted prefills' pages, until their capture is made
        self._arrivals = 0
        self.num_preemptions = 0

    # ----- queries -------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    @property
    def num_running(self) -> int:
        return len(self.lanes)

    @property
    def has_work(self) -> bool:
        """Requests, or copies to or from tierd still in flight (their pages are held until they land)."""
        return bool(self._requests) or self.copies_in_flight > 0

    def flush_blocker(self) -> tuple[str, bool] | None:
        """Why every retained entry cannot be dropped now, and whether that passes by itself (copies to
        or from tierd land within rounds; requests are the caller's to wait out or refuse); None: it can."""
        if self._requests:
            return requests_in_flight(len(self._requests)), False
        if self.copies_in_flight or getattr(self.tiers, "in_flight", 0):
            return "copies to or from tierd are in flight", True
        return None

    def flush_retained(self) -> tuple[int, bool]:
        """Drop every retained entry in every tier and what was learned of recent prompts, as a fresh
        engine (a cache reset; only when ``flush_blocker`` is None). Returns the entries dropped and
        whether tierd was told (``RetainedStore.flush``)."""
        blocker = self.flush_blocker()
        if blocker is not None:
            raise RuntimeError(f"cannot flush now: {blocker[0]}")
        if self.learned is not None:
            self.learned = LearnedPoints(self.config.page_tokens)
        return self.store.flush()

    @property
    def copies_in_flight(self) -> int:
        return self.store.copies_in_flight + self.evictor.copies_in_flight

    def get(self, req_id: str) -> Request | None:
        return self._requests.get(req_id)

    def running(self) -> list[Request]:
        """Requests holding lanes, by lane."""
        return self.lanes.by_lane()

    def stats(self) -> dict[str, float]:
        """Load gauges under the names cache-aware routers read (vLLM's)."""
        return {
            "num_requests_waiting": self.num_waiting,
            "num_requests_running": self.num_running,
            "kv_cache_usage_perc": self.pool.num_used / self.pool.num_pages,
            "num_preemptions_total": self.num_preemptions,
            **self.store.stats(),
            "reuse_restore_rejected_total": self.store.restore_rejections + self.evictor.restore_rejections,
            "live_evictions_total": self.evictor.evictions,
            "live_resumes_total": self.evictor.resumes,
            "live_evictions_abandoned_total": self.evictor.abandoned,
            "live_resumes_withdrawn_total": self.evictor.withdrawn,
            "live_evicting": len(self.evictor.evicting),
        }

    # ----- requests in ----------------------------------------------------------

    def add(self, req: Request) -> Refusal | None:
        """Queue ``req``, or say why not (nothing is kept for a refused request)."""
        if not isinstance(req, Request):
            raise TypeError("add needs a Request")
        if req.arrival != -1 or req.state is not RequestState.WAITING:
            raise ValueError(f"request {req.req_id} was already added once")
        if req.req_id in self._requests:
            return Refusal("bad_request", f"request id {req.req_id!r} is already in use")
        n, limit = len(req.prompt_ids), self.config.max_model_len
        if n >= limit:
            # max_model_len fits the pool (checked in the config), so this also covers "larger than the pool".
            return Refusal("too_long", f"prompt of {n} tokens leaves no room for a completion: "
                                       f"prompt + completion must be at most max_model_len {limit} tokens")
        refusal = self._place_images(req)
        if refusal is not None:
            return refusal
        if self.num_waiting >= self.config.max_queue:
            return Refusal("queue_full", f"{self.num_waiting} requests are waiting (max_queue {self.config.max_queue})")
        if self.learned is not None:
            self._learn(req)
        req.arrival = self._arrivals
        self._arrivals += 1
        self._requests[req.req_id] = req
        self.waiting[req.request_class].append(req)
        self.store.touch_family(req.cache_family)  # its family's entries count as used from its arrival
        return None

    def _place_images(self, req: Request) -> Refusal | None:
        """Match the request's images to its placeholder runs (``engine.image_layout``), or refuse it."""
        token = self.config.image_token_id
        if token is None:
            return Refusal("bad_request", "this model takes no images") if req.images else None
        if not req.images and token not in req.prompt_ids:
            return None
        try:
            layout = image_layout(req.prompt_ids, req.images, token, self.config.image_factor)
        except ValueError as exc:
            return Refusal("bad_request", f"images do not match the prompt: {exc}")
        # reuse reads each image as its digest (salted with the request's scope), and no capture ends inside
        # one (engine.reuse.image_keys); the embedding cache keys it alike
        req.place_images(tuple(ImageKey(s.start, s.end, im.digest) for s, im in zip(layout.spans, layout.images)),
                         self.config.page_tokens)
        req.image_layout = replace(layout, cache_keys=tuple(k.digest for k in req.image_keys))
        return None

    def _learn(self, req: Request) -> None:
        """What ``req`` shares with earlier prompts; past its own capture points, it captures where they diverge."""
        # a point inside an image moves before it (none is left at the prompt's start)
        seen = self.learned.observe(req.key_prefix(len(req.prompt_ids)), req.must_cut_at,
                                    place=lambda point: walk_back(point, req.image_keys))
        # what it shares ends where a resume could: before an image the shared pages end inside
        req.shared_tokens = walk_back(seen.shared_tokens, req.image_keys)
        req.earlier_cuts = seen.earlier_cuts
        learned_at = seen.learned_at
        if learned_at:
            req.learned_at = learned_at
            req.must_cut_at = tuple(sorted({*req.must_cut_at, learned_at}))
            share_ahead(learned_at, req, self.waiting, self.lanes.holders())

    def abort(self, req_id: str, reason: str = "abort", message: str = "",
              kept_tokens: int | None = None) -> FinishEvent | None:
        """End a request; see the module docstring for when. Unknown ids are ignored (None). ``reason``
        "stop": the gateway has the whole output (a stop string matched), so it ends as a stop, counting
        ``kept_tokens`` of its output when given (tokens sampled past the match are not the output's)."""
        if reason not in ("abort", "error", "stop"):
            raise ValueError(f"abort reason must be 'abort', 'error' or 'stop', got {reason!r}")
        req = self._requests.get(req_id)
        if req is None:
            return None
        if kept_tokens is not None and req.kept_tokens is None:
            req.kept_tokens = kept_tokens
        if req.state is RequestState.WAITING:
            self.waiting[req.request_class].remove(req)
            return self._finish(req, reason, message)
        if req.pending_end is None:
            req.pending_end = (reason, message)
        return None

    # ----- a round ------------------------------------------------------------------

    def schedule(self) -> RoundPlan:
        """Plan the next round. The previous non-empty plan must have been ``update``d."""
        if self._in_flight is not None:
            raise RuntimeError("schedule() called while a round is in flight; call update() first")
        plan = RoundPlan()
        self.store.unpin_all()  # the previous round (if any) has been applied
        self.evictor.round_start()
        self.store.moves.round_start()
        self.tiers.poll()  # replies that arrived: demotes landed free their pages, restores land pinned
        for req in [r for r in self.lanes.holders() if r.pending_end is not None]:
            if req.pending_end[0] == "abort" and capture_aborted(plan, req, self.store, self.config.page_tokens):
                # its pages stay out of the pool until the round is applied: one the capture copies from
                # must not be handed to a tierd restore, which writes before the round starts
                held = SequencePages(self.pool, f"aborted-{req.req_id}")
                held.adopt(req.page_table)
                self._held_pages.append(held)
                self.store.pages_returning += held.sole()  # a request short of pages waits a round for them
            plan.finished.append(self._finish(req, *req.pending_end))
        evict_windows(self, plan)
        preempt_for_head(self, plan)
        plan_decodes(self, plan)
        budget = self.config.max_prefill_tokens_per_round
        for req in sorted((r for r in self.lanes.holders() if r.state is RequestState.PREFILLING), key=_rank):
            if budget == 0:
                break
            budget -= add_chunk(plan, req, budget, self.store, self.config.page_tokens, self.waiting,
                                self.config.capture_inside_chunks, self.config.scored_row_cost)
        if not plan.preempted:
            admit(self, plan, budget, time.monotonic())
        if not self.lanes.any_free:
            head = waiting_head(self)
            if head is not None:
                maybe_evict(self, head)
        self._in_flight = None if plan.is_empty else plan
        if plan.is_empty and not plan.started and self.copies_in_flight:
            self.tiers.poll(IDLE_WAIT_S)  # nothing to compute: wait a little for tierd instead of spinning
        return plan

    def update(self, result: RoundResult) -> list[FinishEvent]:
        """Apply the in-flight round's sampled tokens; returns the requests that ended, in plan order."""
        plan = self._in_flight
        if plan is None:
            raise RuntimeError("update() called with no round in flight")
        self._check_result(plan, result)
        self._in_flight = None
        self.store.mark_filled(order.entry_id for order in plan.captures)
        self.store.unpin_all()
        for held in self._held_pages:
            held.release()
        self._held_pages.clear()
        self.store.pages_returning = 0
        for req_id, message in result.errors.items():  # ends at the next round boundary; its token is dropped
            req = self._requests.get(req_id)
            if req is not None and req.pending_end is None:
                req.pending_end = ("error", message, "invalid_request" if req_id in result.invalid else "")
        ended = []
        # (request, tokens computed after this round), in plan order: decodes, then chunks. A speculative
        # decode's lane state covers its accepted drafts too (engine.spec_decode rolls back the rest).
        advanced = [(d.req_id, d.position + 1 + len(result.extra.get(d.req_id, ()))) for d in plan.decodes]
        advanced += [(c.req_id, c.end) for c in plan.prefills]
        sampled = set(plan.sampled_ids())
        rooms = {d.req_id: d.room for d in plan.decodes if d.room}
        for req_id, computed in advanced:
            req = self._requests[req_id]
            req.num_computed_tokens = computed
            extra = result.extra.get(req_id, [])
            if req_id not in sampled or req.pending_end is not None:
                extra.clear()
                continue  # a middle chunk samples nothing; an aborted request's token is dropped
            if req.state is not RequestState.EVICTING:  # eviction may start after the round was planned
                req.state = RequestState.DECODING
            for taken, token in enumerate([result.tokens[req_id], *extra]):
                req.output_ids.append(token)
                reason = self._stop_reason(req, token)
                if reason is not None:
                    del extra[taken:]  # the tokens after the end are not the request's
                    ended.append(self._finish(req, reason))
                    break
            else:
                if req_id in rooms:  # the pages of rejected drafts go back
                    req.page_table.shrink_to(computed + 1)
        return ended

    # ----- ends ----------------------------------------------------------------------

    def _stop_reason(self, req: Request, token: int) -> str | None:
        s = req.sampling
        if token in s.stop_token_ids or (not s.ignore_eos and token in self.config.eos_token_ids):
            return "stop"
        if len(req.output_ids) >= s.max_tokens or req.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, req: Request, reason: str, message: str = "", error_code: str = "") -> FinishEvent:
        if reason in ("abort", "error"):  # the captures it had not reached will not be (engine.reuse.shortfall)
            for point in req.must_cut_at:
                if point > req.num_computed_tokens:
                    key = req.key_prefix(point)
                    if self.store.fates.of(key) is None:  # one it made before a preemption keeps its own fate
                        self.store.fates.note(key, "aborted")
        self.evictor.forget(req.req_id, req.evicted)
        req.evicted = None
        end_tier_wait(req, time.monotonic())  # aborted while it waited for tierd: that wait counts too
        if req.has_lane:
            self.lanes.release(req)
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        del self._requests[req.req_id]
        completion = len(req.output_ids) if req.kept_tokens is None else min(len(req.output_ids), req.kept_tokens)
        return FinishEvent(req.req_id, reason, len(req.prompt_ids), completion, message, error_code,
                           cached_tokens=req.cached_tokens, reuse_kind=req.reuse_kind,
                           reuse_tier=req.reuse_tier if req.cached_tokens else "none", reuse_slot=req.reuse_slot,
                           shortfall=req.shortfall, restore_rejected=req.restore_rejected, tier_wait_s=req.tier_wait_s,
                           live_evictions=req.live_evictions, live_resumes=req.live_resumes,
                           recomputed=req.num_preemptions)

    def _check_result(self, plan: RoundPlan, result: RoundResult) -> None:
        if not isinstance(result, RoundResult):
            raise TypeError("update needs a RoundResult")
        expected = plan.sampled_ids()
        missing = [r for r in expected if r not in result.tokens]
        extra = sorted(set(result.tokens) - set(expected))
        if missing or extra:
            raise ValueError(f"round result does not match the plan: missing {missing}, unexpected {extra}")
        for req_id, token in result.tokens.items():
            if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
                raise ValueError(f"round result for {req_id}: {token!r} is not a token id")
        rooms = {d.req_id: d.room for d in plan.decodes}
        for req_id, extra in result.extra.items():
            if len(extra) > rooms.get(req_id, 0):
                raise ValueError(f"round result for {req_id}: {len(extra)} draft tokens, room for "
                                 f"{rooms.get(req_id, 0)}")
            if any(type(t) is not int or not 0 <= t <= MAX_TOKEN_ID for t in extra):
                raise ValueError(f"round result for {req_id}: draft tokens {extra!r} are not token ids")


_rank = attrgetter("rank")
IDLE_WAIT_S = 0.005
"""How long a round with nothing to compute waits for a tierd reply (only while copies are in flight)."""
