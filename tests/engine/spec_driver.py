"""Serve a few requests in process (scheduler + runner, no sockets) with or without speculation.

``generate`` returns each request's output tokens and the runner's per-round
``RoundResult.extra`` lengths, so tests compare speculative output with plain
decode token for token and see that drafts were accepted.
"""

from __future__ import annotations

import torch

from ignis.engine.models.build import drafter_from_checkpoint, load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.engine.spec_decode import SpecDecoder
from ignis.shared.sampling import SamplingParams


def load(path):
    model, ckpt = load_model(path)
    return model, drafter_from_checkpoint(ckpt)


def generate(model, head, prompts: list[list[int]], k: int, max_tokens: list[int] | int = 24, lanes: int = 4,
             pages: int = 24, prefill_budget: int = 40, sampling: dict | None = None, rounds: int = 2000,
             reuse_slots: int = 0, events: dict | None = None, logprobs: dict | None = None,
             prompt_scores: dict | None = None, grammars=None, grammar_of: dict | None = None,
             vocab_limit: int | None = None, per_request: dict | None = None, drafter=None):
    """-> ({req_id: output ids}, [accepted drafts per speculative decode]). ``reuse_slots`` > 0: prompt reuse
    on, with that many host slots; ``events`` collects the FinishEvents; ``logprobs`` collects each request's
    TokenLogprobs, one per output token, in order; ``prompt_scores`` each request's PromptLogprobs;
    ``grammars`` (an ``engine.grammar_lanes.GrammarLanes``) constrains the requests ``grammar_of`` names
    (req_id -> grammar); ``per_request`` collects each request's accepted drafts per round; ``drafter(model,
    state, k)`` makes the drafter (default: the multi-token-prediction ``head``'s)."""
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                      max_prefill_tokens_per_round=prefill_budget, speculative_tokens=k,
                                      max_queue=max(256, len(prompts))),
                      host_slots=reuse_slots, reuse=reuse_slots > 0)
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, fill=float("nan"))
    state.allocate_slots(0, reuse_slots)
    runner = ModelRunner(model, state, vocab_limit=vocab_limit, grammars=grammars)
    if k:
        runner.use_drafter(drafter(model, state, k) if drafter is not None else SpecDecoder(model, head, state, k))
    limits = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=n, **(sampling or {})))
            for i, (p, n) in enumerate(zip(prompts, limits))]
    for req in reqs:
        if grammar_of and req.req_id in grammar_of:
            assert grammars.constrain(req.req_id, grammar_of[req.req_id]) is None
        assert sched.add(req) is None
    accepted: list[int] = []
    for _ in range(rounds):
        if not sched.has_work:
            break
        plan = sched.schedule()
        result, lps = runner.run(plan)
        if plan.is_empty:
            continue
        if prompt_scores is not None:
            for rid, msgs in result.prompt_logprobs.items():
                prompt_scores.setdefault(rid, []).extend(msgs)
        if logprobs is not None:
            for rid, lp in lps.items():
                logprobs.setdefault(rid, []).extend(lp if isinstance(lp, list) else [lp])
        for ev in sched.update(result):
            runner.release(ev.req_id)
            if events is not None:
                events[ev.req_id] = ev
        accepted += [len(v) for v in result.extra.values()]
        if per_request is not None:
            for rid, v in result.extra.items():
                per_request.setdefault(rid, []).append(len(v))
    assert not sched.has_work, "requests left after the round limit"
    return {r.req_id: list(r.output_ids) for r in reqs}, accepted
