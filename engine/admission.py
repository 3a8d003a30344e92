"""Admission: which waiting requests take a lane this round, and where their prefill starts.

Order. Interactive requests before agent ones, FIFO within a class, strictly in
that order: if the head does not fit, nothing behind it is admitted (so a big
request is not starved by small ones). A request fits when a lane is free and
the pages for all its tokens plus one (its first decode) are free; those pages
are taken at admission, so a prefill never runs short. Admission stops when the
round's prefill budget is spent; the scheduler admits nothing in a round that
preempted.

A lower-tier match is restored without waiting: the head posts the lookup
and then the restore, waits at the head of its queue, and is admitted in the
round after the bytes land (``engine.reuse.lower_moves``). It waits at most
``tier_wait_limit_s``: past it tierd is taken as stalled, the head computes
from its device match (its shortfall ``tier_failed``) and no request asks
tierd again until it answers something (``RetainedStore.give_up_below``), so
a frozen tierd holds the queue once, for that long, not for
``--tierd-timeout`` per request. How long it waited is its ``tier_wait_s``
(the done line's ``tier_wait_ms``).

Reuse. With a ``RetainedStore`` (slots > 0), admission first looks up the
longest retained prefix of the request's tokens: full pages are shared, the
partial last page copied (``plan.copies_before``), the state image copied into
the lane (``LaneStart.restore_slot``), and prefill starts after the match.
Retained pages never delay an admission: the store releases entries,
lowest-ranked first, before the head is left waiting.

Subagent bursts. While a running request prefills towards a capture point
the waiting request shares (a retained prefix, a learned point given to it by
a later arrival: ``engine.burst_points``), or a capture of a longer prefix of
the waiting request's prompt is still pending (its round not yet applied: its
slot holds nothing), the waiting request waits, then resumes from the
captured prefix. It never reads a slot that is not filled; the scheduler's
``update`` marks a round's captures filled.

Shortfall. On its first admission a request records why it resumed less than
it shares with a recent prompt (``engine.reuse.shortfall``), for the done line
and ``ignis:reuse_shortfall_total``; nothing is decided by it.

Resumed evictions. An evicted sequence at the head of the queues posts the
restores of its copies into reserved pages and the staging slot (one at a
time: the slot has one user) and waits there; in the round after they land
(and pass the finite check) it takes a lane, its table shares the restored
pages, and it decodes on where it stopped. It recomputes when its lower
copy is gone or not finite. Nothing behind it is admitted meanwhile. When
another request leads meanwhile (one of a higher class arrived, or one was
preempted to the front of its queue) and waits, the reservation is not left
idle behind it: for a head short of pages the resume is withdrawn (its room
goes back, its copies stay below, it posts them again when it leads the
queues), otherwise it takes a free lane once its copies have landed, as it
would have at the head. An evicted head waiting for the room to come back
into asks for it as any head short of pages does (``pages_wanted``, a live
eviction of a lower class's sequence).

Rejected restores. A restore whose bytes are not finite is never used (the
store falls back to a device match or none; an evicted sequence recomputes);
the request counts it (``restore_rejected``, in its done line). Pure Python, no torch.
"""

from __future__ import annotations

from ignis.engine.preemption import maybe_evict, pages_coming
from ignis.engine.burst_points import capture_ahead
from ignis.engine.prefill_chunks import add_chunk, capture_kind
from ignis.engine.request import Request, RequestState
from ignis.engine.reuse.shortfall import shortfall_reason
from ignis.engine.schedule import LaneStart, RoundPlan
from ignis.engine.scheduler_state import SchedulerState


def admit(sched: SchedulerState, plan: RoundPlan, budget: int, now: float) -> None:
    """Admit waiting requests in order while lanes are free and ``budget`` prefill tokens last. ``now``
    (monotonic seconds) times the waits for lower-tier matches."""
    while budget > 0 and sched.lanes.any_free:
        queue = next((q for q in sched.waiting.values() if q), None)
        if queue is None:
            return
        req = queue[0]
        if req.evicted is not None:
            if not _resume_evicted(sched, plan, req):
                if req.req_id in sched.evictor.resuming:
                    req.pages_wanted = 0
                else:  # it waits for room or the staging slot
                    _resume_behind(sched, plan, req, short=True)
                    _ask_room(sched, req)
                return  # its copies are on their way back (or wait for room): nothing overtakes it
            budget -= _resumed_chunk(sched, plan, req, budget)
            continue
        spent = _admit_head(sched, plan, queue, req, budget, now)
        if spent is None:
            _resume_behind(sched, plan, req, short=req.pages_wanted > 0)
            return
        budget -= spent


def _admit_head(sched: SchedulerState, plan: RoundPlan, queue, req: Request, budget: int, now: float) -> int | None:
    """Admit ``req``, the head of ``queue``: the prefill tokens it takes this round (None: it waits)."""
    page_tokens = sched.config.page_tokens
    tokens = req.key_prefix(req.num_tokens)  # images as their digests (engine.reuse.image_keys)
    # a request scoring its prompt computes every prompt row: it resumes from nothing and waits for no one
    scores = req.sampling.prompt_logprobs is not None
    hit = None if scores else sched.store.lookup(tokens)
    if not scores:
        req.restore_rejected += sched.store.claim_rejections(tokens)
    matched = hit.num_tokens if hit else 0
    if not scores:
        ahead = capture_ahead(tokens, matched, sched.lanes.holders(),
                              lambda other, point: capture_kind(other, point, sched.store, page_tokens))
        pending = sched.store.pending_prefix(tokens)
        if not ahead and pending > matched and sched.store.pending_below(tokens) >= pending:
            # its match is being looked up or copied back from a lower tier: it waits, within a bound
            if req.tier_wait_since is None:
                req.tier_wait_since = now
            if now - req.tier_wait_since < sched.config.tier_wait_limit_s:
                return None
            sched.store.give_up_below(tokens, now - req.tier_wait_since)  # slow or frozen: compute it
        elif ahead or pending > matched:
            return None  # a request ahead is about to retain this prefix: resume from it once it is filled
    end_tier_wait(req, now)
    shared = hit.num_tokens // page_tokens if hit else 0
    needed = sched.pool.pages_for(req.num_tokens + 1) - shared
    if needed > sched.pool.num_free:
        sched.store.reclaim_pages(needed)
    if needed > sched.pool.num_free:
        if sched.pool.num_free + pages_coming(sched) < needed:
            _withdraw_resumes(sched, keep=req)  # the room resumes behind it reserved goes back first
        short = sched.pool.num_free + pages_coming(sched) < needed
        req.pages_wanted = needed if short else 0  # engine.preemption.preempt_for_head reads it
        if short:
            maybe_evict(sched, req)
        return None  # head of line waits (for pages, or for pages on their way back); nothing overtakes it
    req.pages_wanted = 0
    queue.popleft()
    sched.lanes.take(req)
    req.num_computed_tokens = 0
    if hit is not None:
        sched.store.resumed(hit)
        plan.copies_before.extend(req.page_table.fork_from(hit.pages, hit.num_tokens))
        req.num_computed_tokens = hit.num_tokens
        if req.num_preemptions == 0:
            req.cached_tokens = hit.num_tokens
            req.reuse_kind, req.reuse_slot, req.reuse_tier = hit.kind, hit.slot_tier, hit.tier
    if req.num_preemptions == 0 and sched.learned is not None and not scores:
        req.shortfall = shortfall_reason(tokens, matched, req.shared_tokens, req.earlier_cuts,
                                         sched.store.fates, page_tokens, tuple(req.must_cut_at))
    req.page_table.ensure_capacity(req.num_tokens + 1)
    req.state = RequestState.PREFILLING
    plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids, tuple(req.output_ids),
                                  restore_slot=hit.slot if hit else None, adapter=req.adapter_slot))
    return add_chunk(plan, req, budget, sched.store, page_tokens, sched.waiting,
                     sched.config.capture_inside_chunks, sched.config.scored_row_cost)


def _resumed_chunk(sched: SchedulerState, plan: RoundPlan, req: Request, budget: int) -> int:
    """A resumed sequence that recomputes (its copies were lost) prefills its first chunk: the tokens it takes."""
    if req.state is not RequestState.PREFILLING:
        return 0
    return add_chunk(plan, req, budget, sched.store, sched.config.page_tokens, sched.waiting,
                     sched.config.capture_inside_chunks, sched.config.scored_row_cost)


def _resume_behind(sched: SchedulerState, plan: RoundPlan, head: Request, short: bool) -> None:
    """``head`` waits. An evicted sequence whose copies are coming back into room it reserved (it led the
    queues when it posted them; a later arrival of a higher class, or a request preempted to the front of
    its own queue, now leads) must not hold that room idle behind it: for a head ``short`` of pages (or,
    evicted itself, of the staging slot) every such resume gives its room back (``Evictor.withdraw``: the
    copies below stay, it prepares again when it leads); otherwise one leading a later queue takes a free
    lane once its copies have landed, using nothing the head waits for."""
    if short:
        _withdraw_resumes(sched, keep=head)
        return
    behind = next((q[0] for q in sched.waiting.values() if q and q[0] is not head
                   and q[0].req_id in sched.evictor.resuming), None)
    if behind is not None:
        _resume_evicted(sched, plan, behind, may_recompute=False)  # a recompute would take pages: it waits


def _withdraw_resumes(sched: SchedulerState, keep: Request) -> None:
    """Every resume but ``keep``'s gives its reserved room back (its copies below stay)."""
    for req_id in [r for r in sched.evictor.resuming if r != keep.req_id]:
        sched.evictor.withdraw(req_id)


def _ask_room(sched: SchedulerState, head: Request) -> None:
    """``head``, evicted, waits for room to bring its copies back into (or to recompute in, if they were
    lost): when the pages free and on their way fall short it asks for room as any head short of pages
    does (``pages_wanted``; a live eviction of a sequence ranked below it)."""
    record, pool = head.evicted, sched.pool
    tokens = head.num_tokens + 1 if record.lost else max(record.num_pages * pool.page_tokens, head.num_tokens + 1)
    room = pool.pages_for(tokens)
    short = room > pool.num_free + pages_coming(sched)
    head.pages_wanted = room if short else 0
    if short:
        maybe_evict(sched, head)


def end_tier_wait(req: Request, now: float) -> None:
    """``req`` no longer waits for tierd (its match came back, was given up, or it ended): the wait counted."""
    if req.tier_wait_since is not None:
        req.tier_wait_s += now - req.tier_wait_since
        req.tier_wait_since = None


def _resume_evicted(sched: SchedulerState, plan: RoundPlan, req: Request, may_recompute: bool = True) -> bool:
    """``req`` was evicted: once its copies are back (posted the first time it is the head, landed in a
    later round), it takes a lane and decodes on; if they are gone or not finite, it recomputes (unless
    ``may_recompute`` is False: it then waits to recompute when it leads the queues).
    False: not yet (it waits at the head of its queue)."""
    record = req.evicted
    pool = sched.pool
    room = pool.pages_for(max(record.num_pages * pool.page_tokens, req.num_tokens + 1))
    if req.req_id not in sched.evictor.resuming and room > pool.num_free:
        sched.store.reclaim_pages(room)
    rejected = sched.evictor.restore_rejections
    status = "failed" if record.lost or not sched.evictor.enabled else sched.evictor.prepare(req, record, pool)
    record.lost = status == "failed"
    req.restore_rejected += sched.evictor.restore_rejections - rejected
    if status == "wait":
        return False
    if status == "failed":
        if not may_recompute:
            return False
        needed = pool.pages_for(req.num_tokens + 1)
        if needed > pool.num_free:
            sched.store.reclaim_pages(needed)
        if needed > pool.num_free:
            return False
    sched.waiting[req.request_class].popleft()
    sched.lanes.take(req)
    req.evicted = None
    req.pages_wanted = 0
    if status == "ready":
        req.live_resumes += 1
        req.page_table.adopt(sched.evictor.take(req, record))  # the restored pages and the room after them
        req.page_table.ensure_capacity(req.num_tokens + 1)
        req.num_computed_tokens = record.computed
        req.state = RequestState.DECODING  # decodes on next round: nothing is recomputed
        plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids,
                                      tuple(req.output_ids), restore_slot=sched.evictor.staging_slot,
                                      adapter=req.adapter_slot))
    else:
        req.page_table.ensure_capacity(req.num_tokens + 1)
        req.num_computed_tokens = 0
        req.num_preemptions += 1  # counted as a recompute (the live eviction was not)
        req.state = RequestState.PREFILLING  # the lower copy is gone: recompute instead
        plan.started.append(LaneStart(req.req_id, req.lane, req.sampling, req.prompt_ids,
                                      tuple(req.output_ids), adapter=req.adapter_slot))
    return True

