"""Room for running sequences: decodes planned under page pressure, preemption, live eviction.

Decodes. Every decoding request gets one step per round, in rank order, and
its page table grows a page at a time to hold it. Retained pages are given up
(``store.reclaim_pages``) before anything running is, then the room reserved
by resumes of evicted sequences ranked below it (``withdraw_resumes_below``);
a decode short of a page waits a round while pages are on their way back
(``pages_coming``: demotes in flight, withdrawn restores still landing).

Live eviction (with tierd). A sequence moves down a tier one window between
rounds (``engine.eviction``; each copy is posted, and the next goes once it
has landed, while the other lanes decode); once all of it has moved it gives up its lane
and pages and waits at the front of its class's queue, to resume without
recomputing. One moves at a time. It starts when the head of the queue cannot
fit (the lowest-ranked decoding sequence ranked below the head), and when a
decode needs a page and none is free (the lowest-ranked decoding sequence not
yet given its step this round, possibly the one asking): decodes short of a
page then wait a round while the pages are on their way, and nothing is
recomputed.

Preemption (recompute). When a decode needs a page, none is free and no live
eviction can free one (no tierd, or the last eviction failed), the
lowest-ranked running request (agent before interactive, latest arrival
first) gives up its pages and lane and goes back to the FRONT of its class's
queue; its output so far stays, and on readmission it prefills prompt +
output and goes on sampling where it stopped. It keeps its arrival, hence
its rank. The same happens for the head of the queue (``preempt_for_head``)
when it finds no free lane, a decoding request ranks below it, and the tier
refused the last live eviction with no KV-disk behind it (with KV-disk on,
no live sequence is pushed out: the head waits), and likewise when it found
too few free pages. Pure Python, no torch.
"""

from __future__ import annotations

from operator import attrgetter

from ignis.engine.request import CLASS_RANK, Request, RequestState
from ignis.engine.schedule import DecodeItem, Preempted, RoundPlan
from ignis.engine.scheduler_state import SchedulerState

_rank = attrgetter("rank")


def plan_decodes(sched: SchedulerState, plan: RoundPlan) -> None:
    """One decode per decoding request, preempting the lowest-ranked running ones for pages."""
    scheduled: set[str] = set()
    for req in sorted((r for r in sched.lanes.holders() if r.state is RequestState.DECODING), key=_rank):
        if req.state is not RequestState.DECODING:
            continue  # preempted earlier in this loop
        position = req.num_computed_tokens
        needed = req.page_table.pages_needed(position + 1)
        if needed > sched.pool.num_free:
            sched.store.reclaim_pages(needed)
        short = req.page_table.pages_needed(position + 1)
        if short > sched.pool.num_free + pages_coming(sched):
            withdraw_resumes_below(sched, req)  # room reserved for a waiting sequence ranked below goes first
        if short > sched.pool.num_free and (sched.pool.num_free + pages_coming(sched) >= short
                                            or _evict_for_pages(sched, scheduled)):
            continue  # pages are on their way down a tier: this decode waits a round, nothing recomputes
        while req.page_table.pages_needed(position + 1) > sched.pool.num_free:
            victim = max((r for r in sched.lanes.holders() if r.req_id not in scheduled), key=_rank)
            plan.preempted.append(preempt(sched, victim))
            if victim is req:
                break
        if req.state is not RequestState.DECODING:
            continue
        room = draft_room(sched, req)
        while room and req.page_table.pages_needed(position + 1 + room) > sched.pool.num_free:
            room -= 1  # drafts never take pages a plain step would need, nor preempt for them
        req.page_table.ensure_capacity(position + 1 + room)
        plan.decodes.append(DecodeItem(req.req_id, req.lane, position, req.token_at(position),
                                       req.page_table.pages, room, req.rope_delta))
        scheduled.add(req.req_id)


def pages_coming(sched: SchedulerState) -> int:
    """Pages that go back to the free list by themselves once copies in flight are done with them."""
    return sched.store.pages_coming + sched.evictor.pages_coming


def withdraw_resumes_below(sched: SchedulerState, req: Request) -> None:
    """Every evicted sequence ranked below ``req`` whose copies are coming back into room it reserved gives
    that room back (``Evictor.withdraw``: its copies below stay): a waiting sequence's reservation never
    makes a running or waiting one ranked above it short of pages."""
    resuming = sched.evictor.resuming
    for queue in sched.waiting.values():
        for other in [r for r in queue if r.req_id in resuming and r.rank > req.rank]:
            sched.evictor.withdraw(other.req_id)


def draft_room(sched: SchedulerState, req: Request) -> int:
    """Draft tokens ``req`` may verify this round: --speculative-tokens, less what its max_tokens and
    the model length leave (a step already yields one token)."""
    k = sched.config.speculative_tokens
    if not k:
        return 0
    left = min(req.sampling.max_tokens - len(req.output_ids), sched.config.max_model_len - req.num_tokens)
    return max(0, min(k, left - 1))


def _evict_for_pages(sched: SchedulerState, scheduled: set[str]) -> bool:
    """Decode-time pressure: True when a live eviction is under way (started here if none was), so
    the decode short of a page waits; False when none can help (then the caller preempts)."""
    evictor = sched.evictor
    if not evictor.enabled or evictor.failed_lately():
        return False
    if evictor.evicting:
        return True
    if not evictor.may_start():
        return False  # backing off after a refusal: the caller preempts by recompute
    candidates = [r for r in sched.lanes.holders()
                  if r.state is RequestState.DECODING and r.req_id not in scheduled]
    if not candidates:
        return False
    victim = max(candidates, key=_rank)
    victim.state = RequestState.EVICTING
    evictor.start(victim)
    return True


def preempt(sched: SchedulerState, req: Request) -> Preempted:
    """``req`` gives up its lane and pages and waits at the front of its queue, to recompute."""
    lane = req.lane
    sched.evictor.forget(req.req_id)  # a window whose demote is in flight stays held until it lands
    sched.lanes.release(req)
    req.state = RequestState.WAITING
    req.num_computed_tokens = 0
    req.num_preemptions += 1
    sched.num_preemptions += 1
    sched.waiting[req.request_class].appendleft(req)
    return Preempted(req.req_id, lane)


def evict_windows(sched: SchedulerState, plan: RoundPlan) -> None:
    """Between rounds: one window of every evicting sequence moves down (see engine.eviction)."""
    for req in [r for r in sched.lanes.holders() if r.state is RequestState.EVICTING]:
        outcome = sched.evictor.step(req)
        if outcome == "failed":
            sched.evictor.abandon(req)
            req.state = RequestState.DECODING
        elif outcome == "done":
            record = sched.evictor.evicting.pop(req.req_id)
            lane = req.lane
            sched.lanes.release(req)
            req.state = RequestState.WAITING
            req.evicted = record
            req.live_evictions += 1
            sched.waiting[req.request_class].appendleft(req)
            plan.preempted.append(Preempted(req.req_id, lane))


def preempt_for_head(sched: SchedulerState, plan: RoundPlan) -> None:
    """Before decodes are planned: the head of the queue finds no free lane (or too few free pages, as
    its last admission try found), the tier refused the last live eviction (backing off) and keeps
    nothing on KV-disk: the lowest-ranked decoding request ranked below the head gives up its lane and
    pages to recompute later (one a round), so the head is admitted."""
    evictor = sched.evictor
    if not evictor.enabled or evictor.evicting or evictor.may_start() or evictor.tiers.live_on_disk:
        return
    head = waiting_head(sched)
    if head is None:
        return
    short_of_pages = head.pages_wanted > sched.pool.num_free + pages_coming(sched)
    if sched.lanes.any_free and not short_of_pages:
        return
    victim = _lowest_below(sched, head)
    if victim is not None:
        plan.preempted.append(preempt(sched, victim))


def waiting_head(sched: SchedulerState) -> Request | None:
    """The head of the queue, when room made now would let it in: None while it waits for tierd to bring its
    lower-tier match back (``engine.admission``; a lane freed for it would stand idle until then)."""
    head = next((q[0] for q in sched.waiting.values() if q), None)
    return None if head is None or head.tier_wait_since is not None else head


def maybe_evict(sched: SchedulerState, head: Request) -> None:
    """``head`` cannot fit: start evicting the lowest-ranked decoding sequence ranked below it."""
    if not sched.evictor.may_start() or sched.evictor.evicting:
        return
    victim = _lowest_below(sched, head)
    if victim is not None:
        victim.state = RequestState.EVICTING
        sched.evictor.start(victim)


def _lowest_below(sched: SchedulerState, head: Request) -> Request | None:
    """The lowest-ranked decoding request of a class ranked below ``head``'s (None: none)."""
    below = [r for r in sched.lanes.holders() if r.state is RequestState.DECODING
             and CLASS_RANK[r.request_class] > CLASS_RANK[head.request_class]]
    return max(below, key=_rank, default=None)
