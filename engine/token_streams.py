"""Output fan-out: the requests the scheduler accepted, as the gateways that sent them see them.

Per request: who asked and when, and when it was admitted and streamed.
A request's first admission goes back as ``Admitted`` (how much of its prompt
was resumed, before any token: Anthropic's ``message_start`` reports it).
Each round's tokens go back as one ``TokenBatch`` per gateway, after the
``PromptLogprobs`` of requests that score their prompt; a request's end
goes back as ``Finished`` (usage, reuse, timings) followed by one ``done`` line
in the log. The latency histograms and finish counters are updated before the
message a client could act on is sent.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import orjson

from ignis.engine.metrics import EngineMetrics
from ignis.shared.wire import (
    Admitted,
    Finished,
    Generate,
    ReuseInfo,
    StreamTokens,
    Timings,
    TokenBatch,
    TokenLogprobs,
    Usage,
)
from ignis.shared.zmq_queues import Channel

log = logging.getLogger("ignis.engine")


@dataclass
class Tracked:
    """What the loop remembers about a request beyond the scheduler: who asked, and when."""

    peer: bytes
    request_class: str
    prompt_tokens: int
    arrived: float
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)  # speculative steps: drafts verified at position i
    accepted_at: list[int] = field(default_factory=list)  # and accepted there
    extra: dict = field(default_factory=dict)
    mark_missing: str | None = None  # capture marks the gateway could not find, and why
    notes: str | None = None  # what the gateway could not honour for it (``Generate.notes``)
    undrafted: str | None = None  # why it never drafted though a drafter is in use (``ModelRunner.undrafted``)
    salted: bool = False  # the client sent a cache_salt: it reuses only state made under the same salt
    adapter: str | None = None  # the LoRA adapter the request ran with
    prompt_scored: int = 0  # prompt tokens whose logprobs were sent (prompt_logprobs)


class TokenStreams:
    """``tracked`` holds every request from its acceptance until its ``Finished`` is sent."""

    def __init__(self, channel: Channel, metrics: EngineMetrics, done_lines: bool = True):
        self.channel = channel
        self.metrics = metrics
        self.tracked: dict[str, Tracked] = {}
        self.done_level = logging.INFO if done_lines else logging.DEBUG
        """Where done lines go: INFO, or DEBUG with --disable-log-requests (vLLM's)."""

    def track(self, peer: bytes, msg: Generate) -> None:
        self.tracked[msg.id] = Tracked(peer, msg.request_class, len(msg.prompt_ids), time.monotonic(),
                                       mark_missing=msg.mark_missing, notes=msg.notes,
                                       salted=msg.cache_salt is not None,
                                       adapter=msg.adapter)

    def admitted(self, started, now: float, scheduler) -> None:
        """Requests that took a lane this round (``plan.started``); a resume keeps its first admission. A
        first admission tells the gateway how much of the prompt was resumed."""
        for s in started:
            t = self.tracked.get(s.req_id)
            if t is not None and t.admitted is None:
                t.admitted = now
                self.metrics.queue_time.observe(now - t.arrived)
                req = scheduler.get(s.req_id)
                if req is not None:
                    self.channel.send(Admitted(s.req_id, req.cached_tokens), t.peer)

    def undrafted(self, reasons: dict[str, str]) -> None:
        """Requests that will not draft though a drafter is in use, and why: noted once each, and counted."""
        for rid, why in reasons.items():
            t = self.tracked.get(rid)
            if t is not None and t.undrafted is None:
                t.undrafted = why
                self.metrics.spec_undrafted.labels(self.metrics.model_name, why).inc()

    def send_tokens(self, result, logprobs: dict, scheduler) -> None:
        """One round's sampled tokens, batched per gateway; a request already ending sends none. Prompt
        scores go first: a stream's come before its first tokens."""
        now = time.monotonic()
        for rid, scores in result.prompt_logprobs.items():
            t = self._streaming(rid, scheduler)
            if t is None:
                continue
            for msg in scores:
                self.channel.send(msg, t.peer)
                t.prompt_scored += len(msg.ranks)
        by_peer: dict[bytes, list[StreamTokens]] = {}
        for rid, token in result.tokens.items():
            tokens = (token, *result.extra.get(rid, ()))
            t = self._streaming(rid, scheduler)
            if t is None:
                continue
            if t.first_token is None:
                t.first_token = now
                self.metrics.ttft.observe(now - t.arrived)
            else:
                self.metrics.itl.observe(now - t.last_token)
            t.last_token = now
            t.tokens += len(tokens)
            if result.drafted.get(rid):
                self._count_drafts(t, result.drafted[rid], len(tokens) - 1)
            try:
                stream = _stream_tokens(rid, tokens, logprobs.get(rid))
            except Exception as exc:  # this request ends with an error; the others and the loop go on
                log.exception("request %s: its token could not be sent; it ends with an error", rid)
                scheduler.abort(rid, "error", f"engine error while sending its tokens: {exc}")
                continue
            by_peer.setdefault(t.peer, []).append(stream)
        for peer, streams in by_peer.items():
            self.channel.send(TokenBatch(tuple(streams)), peer)

    def _streaming(self, rid: str, scheduler) -> Tracked | None:
        """``rid``'s record while its output still goes out (None: unknown, or already ending)."""
        t = self.tracked.get(rid)
        req = scheduler.get(rid)
        return None if t is None or (req is not None and req.pending_end is not None) else t

    def _count_drafts(self, t: Tracked, drafted: int, accepted: int) -> None:
        m = self.metrics
        m.spec_drafts.inc()
        m.spec_draft_tokens.inc(drafted)
        m.spec_accepted.inc(accepted)
        for i in range(drafted):
            if i == len(t.drafted_at):
                t.drafted_at.append(0)
                t.accepted_at.append(0)
            t.drafted_at[i] += 1
            if i < accepted:
                t.accepted_at[i] += 1
                m.spec_accepted_per_pos.labels(m.model_name, str(i)).inc()

    def finish(self, ev, model_name: str) -> None:
        try:
            self._finish(ev, model_name)
        except Exception:  # the request is over either way; the loop must go on
            log.exception("request %s: error while reporting its end", ev.req_id)

    def _finish(self, ev, model_name: str) -> None:
        """``ev`` (a ``FinishEvent``) ended its request: metrics, ``Finished`` to its gateway, the done line."""
        t = self.tracked.pop(ev.req_id, None)
        if t is None:
            return
        now = time.monotonic()
        admitted = t.admitted if t.admitted is not None else now
        first = t.first_token
        timings = Timings(
            queue_ms=round((admitted - t.arrived) * 1000, 3),
            prefill_ms=round(((first or now) - admitted) * 1000, 3),
            ttft_ms=round(((first or now) - t.arrived) * 1000, 3),
        )
        usage = Usage(prompt_tokens=t.prompt_tokens, completion_tokens=ev.completion_tokens,
                      cached_tokens=ev.cached_tokens)
        reuse = ReuseInfo(kind=ev.reuse_kind, tier=ev.reuse_tier)
        # metrics first: a client that sees Finished and scrapes must see this request counted
        self.metrics.prefix_hits.inc(ev.cached_tokens)
        if ev.cached_tokens:
            self.metrics.reuse_hits.labels(self.metrics.model_name, ev.reuse_kind, ev.reuse_tier).inc()
            self.metrics.reuse_hit_tokens.labels(self.metrics.model_name, ev.reuse_kind, ev.reuse_tier).inc(
                ev.cached_tokens)
        if ev.tier_wait_s:
            self.metrics.tier_wait.observe(ev.tier_wait_s)
        if ev.shortfall != "none":
            self.metrics.reuse_shortfall.labels(self.metrics.model_name, ev.shortfall).inc()
        self.metrics.finished.labels(model_name, ev.reason).inc()
        if t.adapter is not None:
            self.metrics.lora_requests.labels(model_name, t.adapter).inc()
        self.metrics.prompt_tokens.inc(t.prompt_tokens)
        self.metrics.prefix_queries.inc(t.prompt_tokens)
        self.metrics.e2e.observe(now - t.arrived)
        self.metrics.request_prompt.observe(t.prompt_tokens)
        self.metrics.request_generation.observe(ev.completion_tokens)
        if t.admitted is not None and first is not None:  # a request refused or aborted in its queue has no phases
            last = t.last_token if t.last_token is not None else first
            self.metrics.prefill_time.observe(first - t.admitted)
            self.metrics.decode_time.observe(last - first)
            self.metrics.inference_time.observe(last - t.admitted)
        self.channel.send(Finished(ev.req_id, ev.reason, usage, reuse=reuse, timings=timings, message=ev.message,
                                   error_code=ev.error_code), t.peer)
        decode_s = (t.last_token - first) if first is not None and t.last_token is not None else 0.0
        done = {
            "event": "done", "id": ev.req_id, "model": model_name, "class": t.request_class,
            "prompt_tokens": t.prompt_tokens,
            "cached_tokens": ev.cached_tokens, "completion_tokens": ev.completion_tokens,
            "reuse_kind": ev.reuse_kind, "tier": ev.reuse_tier, "slot": ev.reuse_slot, "queue_ms": timings.queue_ms,
            # null where there was no such phase: never admitted (no prefill), or no token (no first token)
            "prefill_ms": timings.prefill_ms if t.admitted is not None else None,
            "ttft_ms": timings.ttft_ms if first is not None else None,
            "decode_tokens_per_s": round((t.tokens - 1) / decode_s, 2) if decode_s > 0 and t.tokens > 1 else 0.0,
            "finish_reason": ev.reason,
            "shortfall": ev.shortfall,  # why it reused less than it shares with an earlier prompt (or "none")
        }
        if t.drafted_at:  # speculative decoding: drafted and accepted tokens, acceptance per draft position
            done["spec"] = {"drafted": sum(t.drafted_at), "accepted": sum(t.accepted_at),
                            "accept_rate_per_pos": [round(a / d, 3) for a, d in zip(t.accepted_at, t.drafted_at)]}
        elif t.undrafted is not None:  # a drafter is in use and this request never drafts: why
            done["spec"] = {"off": t.undrafted}
        if ev.live_evictions or ev.recomputed:  # it gave up its lane while running (docs/operations.md)
            done["preempted"] = {"evicted_live": ev.live_evictions, "resumed_live": ev.live_resumes,
                                 "recomputed": ev.recomputed}
        if ev.tier_wait_s:  # it waited at the head of its queue for its match to come back from a lower tier
            done["tier_wait_ms"] = round(ev.tier_wait_s * 1000, 3)
        if ev.restore_rejected:  # ignis:reuse_restore_rejected_total{reason="non_finite"} counts them too
            done["restore_rejected"] = {"non_finite": ev.restore_rejected}
        if t.mark_missing:
            done["mark"] = f"missing ({t.mark_missing})"
        if t.notes:  # a schema held leniently, a hosted tool left out, a format not enforced (gateway)
            done["notes"] = t.notes
        if t.salted:  # reuse confined to requests with the same cache_salt
            done["cache_salt"] = True
        if t.adapter is not None:  # the LoRA adapter it ran with (its reuse confined to the adapter's)
            done["adapter"] = t.adapter
        if t.prompt_scored:  # a scored prompt is computed whole: why such a request resumed nothing
            done["prompt_logprobs"] = {"scored": t.prompt_scored}
        if log.isEnabledFor(self.done_level):
            log.log(self.done_level, orjson.dumps(done).decode())


def _stream_tokens(rid: str, tokens: tuple[int, ...], lp) -> StreamTokens:
    """One stream's tokens of a round and, where asked, their logprobs for the wire: ``lp`` is the one
    token's (a plain step) or a list with one per token (a speculative round). Raises
    ``NonFiniteLogprobs`` when a distribution a token was sampled from is not finite: the request's
    state is corrupt."""
    if lp is None:
        return StreamTokens(rid, tokens, None)
    lps = lp[: len(tokens)] if isinstance(lp, list) else [lp]  # the scheduler cuts a round at a stop id
    if len(lps) != len(tokens):
        raise ValueError(f"{len(lps)} logprobs for {len(tokens)} tokens")
    for token, one in zip(tokens, lps):
        if not all(math.isfinite(v) for v in (one.token_logprob, *(v for _, v in one.top))):
            raise NonFiniteLogprobs(f"non-finite logprob for token {token}: its state is corrupt")
    return StreamTokens(rid, tokens, TokenLogprobs(
        logprobs=tuple(one.token_logprob for one in lps),
        top_ids=tuple(tuple(i for i, _ in one.top) for one in lps),
        top_logprobs=tuple(tuple(v for _, v in one.top) for one in lps)))


class NonFiniteLogprobs(ValueError):
    pass
