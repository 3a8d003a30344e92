"""Continuous batching: which requests hold lanes and pages, and what each round computes.

Pure Python, no torch; the runner sees only ``engine.schedule`` dataclasses.

Resources. ``decode_lanes`` lanes (slot indices into the model's live recurrent
state, lowest free first) and a ``PagePool`` of KV pages. A running request
holds one lane and a page table (``SequencePages``).

Admission (in ``schedule``). Interactive requests before agent ones, FIFO within
a class, strictly in that order: if the head does not fit, nothing behind it is
admitted (so a big request is not starved by small ones). A request fits when a
lane is free and the pages for all its tokens plus one (its first decode) are
free; those pages are taken at admission, so a prefill never runs short.
Decode then grows the table a page at a time. Nothing is admitted in a round
that preempted, and only while the round's prefill budget lasts.

Preemption (recompute). When a decode needs a page and none is free, the
lowest-ranked running request (agent before interactive, latest arrival first)
gives up its pages and lane and goes back to the FRONT of its class's queue;
its output so far stays, and on readmission it prefills prompt + output and
goes on sampling where it stopped. It keeps its arrival, hence its rank.

Prefill. At most one chunk per request per round, the round's chunks together
at most ``max_prefill_tokens_per_round`` tokens; a chunk never crosses one of
the request's ``must_cut_at`` points (it may end on one, and the next round
continues from there). Running prefills go first, in rank order, then new ones.

Finish. ``update`` decides: a stop token (``stop_token_ids``, or the model's EOS
unless ``ignore_eos``) ends with "stop" and is part of the output; reaching
``max_tokens`` or ``max_model_len`` tokens ends with "length".

Reuse. With a ``RetainedStore`` (slots > 0), admission first looks up the
longest retained prefix of the request's tokens: full pages are shared, the
partial last page copied (``plan.copies_before``), the state image copied into
the lane (``LaneStart.restore_slot``), and prefill starts after the match. A
chunk that ends on a capture mark (end of system + tools rounded down to
pages: "retained_prefix"; the generation opener: "prompt_checkpoint") is captured after the
forward (``plan.captures``). Retained pages never delay an admission or force
a preemption: the store releases entries, lowest-ranked first, before either.
Subagent bursts: while a running request prefills towards a retained-prefix
point, or a capture of a longer prefix of a waiting request's prompt is still
pending (its round not yet applied: its slot holds nothing), the waiting
request waits, then resumes from the captured prefix. It never reads a slot
that is not filled; ``update`` marks a round's captures filled.

Abort. A waiting request leaves at once (``abort`` returns its FinishEvent). A
running one is marked; a round in flight may still compute it (its token is
dropped by ``update``), and it is freed at the next round boundary: the next
``schedule`` frees its lane and pages and lists it in ``plan.finished``.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from ignis.engine.models.config import PAGE_TOKENS
from ignis.engine.page_pool import PagePool
from ignis.engine.request import CLASS_RANK, REQUEST_CLASSES, Request, RequestState
from ignis.engine.schedule import (
    DecodeItem,
    FinishEvent,
    LaneStart,
    Preempted,
    PrefillChunk,
    RoundPlan,
    RoundResult,
)
from ignis.engine.eviction import Evictor
from ignis.engine.reuse.entries import SlotPool
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.sequence_pages import SequencePages
from ignis.shared.flags import field_doc
from ignis.shared.wire_fields import MAX_TOKEN_ID


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the scheduler; ``num_pages`` and ``eos_token_ids`` come from the model and memory plan."""

    decode_lanes: int = field(default=8, metadata=field_doc("sequences decoding at once (live recurrent states)"))
    num_pages: int = field(default=1024, metadata=field_doc("KV pages in the pool", cli=False))
    max_prefill_tokens_per_round: int = field(
        default=2048, metadata=field_doc("prompt tokens prefilled per round, all requests together"))
    max_queue: int = field(default=256, metadata=field_doc("requests waiting for a lane before new ones are refused"))
    max_model_len: int = field(default=32768, metadata=field_doc("most tokens (prompt + completion) per request"))
    page_tokens: int = field(default=PAGE_TOKENS, metadata=field_doc("tokens per KV page", cli=False))
    eos_token_ids: tuple[int, ...] = field(default=(), metadata=field_doc("the model's end tokens", cli=False))

    def __post_init__(self):
        for name, flag in (("decode_lanes", "--decode-lanes"), ("num_pages", "num_pages"),
                           ("max_prefill_tokens_per_round", "--max-prefill-tokens-per-round"),
                           ("max_queue", "--max-queue"), ("max_model_len", "--max-model-len"),
                           ("page_tokens", "page_tokens")):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        if self.max_model_len > self.num_pages * self.page_tokens:
            raise ValueError(f"--max-model-len {self.max_model_len} exceeds the KV pool "
                             f"({self.num_pages} pages x {self.page_tokens} = {self.num_pages * self.page_tokens} tokens)")
        eos = tuple(self.eos_token_ids)
        if any(type(t) is not int or not 0 <= t <= MAX_TOKEN_ID for t in eos):
            raise ValueError(f"eos_token_ids must be token ids, got {eos!r}")
        object.__setattr__(self, "eos_token_ids", eos)


@dataclass(frozen=True)
class Refusal:
    """Why ``add`` did not queue a request; ``reason`` is a wire refusal code."""

    reason: str  # "too_long" | "queue_full" | "bad_request"
    message: str


class Scheduler:
    """Owns the waiting queues, the lanes and the page pool's live sequences."""

    def __init__(self, config: SchedulerConfig, device_slots: int = 0, host_slots: int = 0, reuse: bool = True,
                 stamp: str = "", eviction_hooks=None, evict_window_pages: int = 16, staging_slot: int | None = None):
        if not isinstance(config, SchedulerConfig):
            raise TypeError("Scheduler needs a SchedulerConfig")
        self.config = config
        self.pool = PagePool(config.num_pages, config.page_tokens)
        self.store = RetainedStore(self.pool, SlotPool(device_slots, host_slots), enabled=reuse, stamp=stamp)
        self.evictor = Evictor(eviction_hooks, evict_window_pages, staging_slot)
        self._waiting: dict[str, deque[Request]] = {c: deque() for c in REQUEST_CLASSES}
        self._requests: dict[str, Request] = {}  # every live (not finished) request
        self._free_lanes = list(range(config.decode_lanes))  # min-heap
        self._lanes: dict[int, Request] = {}
        self._in_flight: RoundPlan | None = None
        self._arrivals = 0
        self.num_preemptions = 0

    # ----- queries -------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @property
    def num_running(self) -> int:
        return len(self._lanes)

    @property
    def has_work(self) -> bool:
        return bool(self._requests)

    def get(self, req_id: str) -> Request | None:
        return self._requests.get(req_id)

    def running(self) -> list[Request]:
        """Requests holding lanes, by lane."""
        return [self._lanes[lane] for lane in sorted(self._lanes)]

    def stats(self) -> dict[str, float]:
        """Load gauges under the names cache-aware routers read (vLLM's)."""
        return {
            "num_requests_waiting": self.num_waiting,
            "num_requests_running": self.num_running,
            "kv_cache_usage_perc": self.pool.num_used / self.pool.num_pages,
            "num_preemptions_total": self.num_preemptions,
            **self.store.stats(),
            "live_evictions_total": self.evictor.evictions,
            "live_resumes_total": self.evictor.resumes,
            "live_evictions_abandoned_total": self.evictor.abandoned,
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
        if self.num_waiting >= self.config.max_queue:
            return Refusal("queue_full", f"{self.num_waiting} requests are waiting (max_queue {self.config.max_queue})")
        req.arrival = self._arrivals
        self._arrivals += 1
        self._requests[req.req_id] = req
        self._waiting[req.request_class].append(req)
        return None

    def abort(self, req_id: str, reason: str = "abort", message: str = "") -> FinishEvent | None:
        """End a request; see the module docstring for when. Unknown ids are ignored (None)."""
        if reason not in ("abort", "error"):
            raise ValueError(f"abort reason must be 'abort' or 'error', got {reason!r}")
        req = self._requests.get(req_id)
        if req is None:
            return None
        if req.state is RequestState.WAITING:
            self._waiting[req.request_class].remove(req)
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
        for req in [r for r in self._lanes.values() if r.pending_end is not None]:
            plan.finished.append(self._finish(req, *req.pending_end))
        self._evict_windows(plan)
        self._plan_decodes(plan)
        budget = self.config.max_prefill_tokens_per_round
        for req in sorted((r for r in self._lanes.values() if r.state is RequestState.PREFILLING), key=_rank):
            if budget == 0:
                break
            budget -= self._add_chunk(plan, req, budget)
        if not plan.preempted:
            self._admit(plan, budget)
        if not self._free_lanes:
            head = next((q[0] for q in self._waiting.values() if q), None)
            if head is not None:
                self._maybe_evict(head)
        self._in_flight = None if plan.is_empty else plan
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
        ended = []
        # (request, tokens computed after this round), in plan order: decodes, then chunks.
        advanced = [(d.req_id, d.position + 1) for d in plan.decodes]
        advanced += [(c.req_id, c.end) for c in plan.prefills]
        sampled = set(plan.sampled_ids())
        for req_id, computed in advanced:
            req = self._requests[req_id]
            req.num_computed_tokens = computed
            if req_id not in sampled or req.pending_end is not None:
                continue  # a middle chunk samples nothing; an aborted request's token is dropped
            if req.state is not RequestState.EVICTING:  # eviction may start after the round was planned
                req.state = RequestState.DECODING
            token = result.tokens[req_id]
            req.output_ids.append(token)
            reason = self._stop_reason(req, token)
            if reason is not None:
                ended.append(self._finish(req, reason))
        return ended

    # ----- internals -------------------------------------------------------------------

    def _plan_decodes(self, plan: RoundPlan) -> None:
        scheduled: set[str] = set()
        for req in sorted((r for r in self._lanes.values() if r.state is RequestState.DECODING), key=_rank):
            if req.state is not RequestState.DECODING:
                continue  # preempted earlier in this loop
            position = req.num_computed_tokens
            needed = req.page_table.pages_needed(position + 1)
            if needed > self.pool.num_free:
                self.store.reclaim_pages(needed)
            while req.page_table.pages_needed(position + 1) > self.pool.num_free:
                victim = max((r for r in self._lanes.values() if r.req_id not in scheduled), key=_rank)
                plan.preempted.append(self._preempt(victim))
                if victim is req:
                    break
            if req.state is not RequestState.DECODING:
                continue
            req.page_table.ensure_capacity(position + 1)
            plan.decodes.append(DecodeItem(req.req_id, req.lane, position, req.token_at(position), req.page_table.pages))
            scheduled.add(req.req_id)

    def _evict_windows(self, plan: RoundPlan) -> None:
        """Between rounds: one window of every evicting sequence moves down (see engine.eviction)."""
        for req in [r for r in self._lanes.values() if r.state is RequestState.EVICTING]:
            outcome = self.evictor.step(req)
            if outcome == "failed":
                self.evictor.abandon(req)
                req.state = RequestState.DECODING
            elif outcome == "done":
                record = self.evictor.evicting.pop(req.req_id)
                lane = req.lane
                self._release(req)
                req.state = RequestState.WAITING
                req.evicted = record
                self._waiting[req.request_class].appendleft(req)
                plan.preempted.append(Preempted(req.req_id, lane))

    def _maybe_evict(self, head: Request) -> None:
        """``head`` cannot fit: start evicting the lowest-ranked decoding sequence ranked below it."""
        if not self.evictor.enabled or self.evictor.evicting:
            return
        below = [r for r in self._lanes.values() if r.state is RequestState.DECODING
                 and CLASS_RANK[r.request_class] > CLASS_RANK[head.request_class]]
        if below:
            victim = max(below, key=_rank)
            victim.state = RequestState.EVICTING
            self.evictor.start(victim)

    def _admit_evicted(self, plan: RoundPlan, req: Request) -> None:
        record, req.evicted = req.evicted, None
        if self.evictor.restore(req, record):
            req.num_computed_tokens = record.computed
            req.state = RequestState.DECODING  # decodes on next round: nothing is recomputed
            plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids,
                                          tuple(req.output_ids), restore_slot=self.evictor.staging_slot))
        else:
            req.state = RequestState.PREFILLING  # the lower copy is gone: recompute instead
            plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids,
                                          tuple(req.output_ids)))

    def _admit(self, plan: RoundPlan, budget: int) -> None:
        staged = False
        while budget > 0 and self._free_lanes:
            queue = next((q for q in self._waiting.values() if q), None)
            if queue is None:
                return
            req = queue[0]
            if req.evicted is not None:
                needed = self.pool.pages_for(req.num_tokens + 1)
                if needed > self.pool.num_free:
                    self.store.reclaim_pages(needed)
                if staged or needed > self.pool.num_free:
                    return
                queue.popleft()
                req.lane = heapq.heappop(self._free_lanes)
                self._lanes[req.lane] = req
                req.page_table = SequencePages(self.pool, req.req_id)
                req.page_table.ensure_capacity(req.num_tokens + 1)
                self._admit_evicted(plan, req)
                staged = True
                if req.state is RequestState.PREFILLING:
                    req.num_computed_tokens = 0
                    budget -= self._add_chunk(plan, req, budget)
                continue
            tokens = req.token_slice(0, req.num_tokens)
            hit = self.store.lookup(tokens)
            matched = hit.num_tokens if hit else 0
            if self.store.pending_prefix(tokens) > matched or self._sibling_capturing(req, tokens, matched):
                return  # a request ahead is about to retain this prefix: resume from it once it is filled
            shared = hit.num_tokens // self.config.page_tokens if hit else 0
            needed = self.pool.pages_for(req.num_tokens + 1) - shared
            if needed > self.pool.num_free:
                self.store.reclaim_pages(needed)
            if needed > self.pool.num_free:
                self._maybe_evict(req)
                return  # head of line waits; nothing overtakes it
            queue.popleft()
            req.lane = heapq.heappop(self._free_lanes)
            self._lanes[req.lane] = req
            req.page_table = SequencePages(self.pool, req.req_id)
            req.num_computed_tokens = 0
            if hit is not None:
                plan.copies_before.extend(req.page_table.fork_from(hit.pages, hit.num_tokens))
                req.num_computed_tokens = hit.num_tokens
                if req.num_preemptions == 0:
                    req.cached_tokens = hit.num_tokens
                    req.reuse_kind, req.reuse_slot, req.reuse_tier = hit.kind, hit.slot_tier, hit.tier
            req.page_table.ensure_capacity(req.num_tokens + 1)
            req.state = RequestState.PREFILLING
            plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids, tuple(req.output_ids),
                                          restore_slot=hit.slot if hit else None))
            budget -= self._add_chunk(plan, req, budget)

    def _add_chunk(self, plan: RoundPlan, req: Request, budget: int) -> int:
        """Plan ``req``'s next chunk (and its capture, if it ends on a mark); returns its size."""
        chunk = self._chunk(req, budget)
        plan.prefills.append(chunk)
        kind = self._capture_kind(req, chunk.end)
        if kind is not None:
            order = self.store.capture(req.token_slice(0, chunk.end), req.page_table, req.lane, kind,
                                       req.request_class, req.last_is_user)
            if order is not None:
                plan.captures.append(order)
        return chunk.num_tokens

    def _prefix_point(self, req: Request) -> int | None:
        if not self.store.enabled or req.system_end is None:
            return None
        p = req.system_end // self.config.page_tokens * self.config.page_tokens
        return p if 0 < p < len(req.prompt_ids) and p in req.must_cut_at else None

    def _sibling_capturing(self, req: Request, tokens: tuple[int, ...], matched: int) -> bool:
        """A burst of subagents shares one system block: while a running request is
        prefilling towards the same retained-prefix point, the next one waits for it
        (at most until that request passes the point) instead of reading the block again."""
        p = self._prefix_point(req)
        if p is None or matched >= p:
            return False
        prefix = tokens[:p]
        for other in self._lanes.values():
            if (other.state is RequestState.PREFILLING and other.num_computed_tokens < p
                    and self._prefix_point(other) == p and other.token_slice(0, p) == prefix):
                return True
        return False

    def _capture_kind(self, req: Request, end: int) -> str | None:
        if not self.store.enabled or end >= len(req.prompt_ids) or end not in req.must_cut_at:
            return None
        if req.opener_start == end:
            return "prompt_checkpoint"
        if req.system_end is not None and req.system_end // self.config.page_tokens * self.config.page_tokens == end:
            return "retained_prefix"
        return None

    def _chunk(self, req: Request, budget: int) -> PrefillChunk:
        start, target = req.num_computed_tokens, req.num_tokens
        end = min(target, start + budget)
        for cut in req.must_cut_at:  # sorted: the first cut past start is the one that binds
            if cut > start:
                end = min(end, cut)
                break
        return PrefillChunk(req.req_id, req.lane, start, end, end == target, req.token_slice(start, end),
                            req.page_table.pages)

    def _preempt(self, req: Request) -> Preempted:
        lane = req.lane
        self.evictor.forget(req.req_id)
        self._release(req)
        req.state = RequestState.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting[req.request_class].appendleft(req)
        return Preempted(req.req_id, lane)

    def _stop_reason(self, req: Request, token: int) -> str | None:
        s = req.sampling
        if token in s.stop_token_ids or (not s.ignore_eos and token in self.config.eos_token_ids):
            return "stop"
        if len(req.output_ids) >= s.max_tokens or req.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, req: Request, reason: str, message: str = "") -> FinishEvent:
        self.evictor.forget(req.req_id)
        if req.evicted is not None:
            self.evictor.hooks.drop(req.req_id, req.evicted)
            req.evicted = None
        if req.has_lane:
            self._release(req)
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        del self._requests[req.req_id]
        return FinishEvent(req.req_id, reason, len(req.prompt_ids), len(req.output_ids), message,
                           cached_tokens=req.cached_tokens, reuse_kind=req.reuse_kind,
                           reuse_tier=req.reuse_tier if req.cached_tokens else "none", reuse_slot=req.reuse_slot)

    def _release(self, req: Request) -> None:
        req.page_table.release()
        req.page_table = None
        del self._lanes[req.lane]
        heapq.heappush(self._free_lanes, req.lane)
        req.lane = None

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


def _rank(req: Request) -> tuple[int, int]:
    return req.rank
