"""Prompt-lookup drafting (engine.ngram_drafter): its lookups, its lanes' tokens, and output equal to plain decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ignis.engine import spec_round
from ignis.engine.models.build import load_model
from ignis.engine.ngram_drafter import CANDIDATES, LaneTokens, NgramDrafter
from ignis.engine.scheduler import Scheduler
from ignis.engine.spec_decode import DraftAsk, SpecDecoder
from tests.engine.spec_driver import generate

GREEDY = {"temperature": 0.0}


def look(tokens, min_n, max_n, k):
    return LaneTokens(tokens).propose(min_n, max_n, k)


def test_the_longest_suffix_wins_then_its_most_recent_occurrence():
    #         0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7, 3, 9] + [5, 6, 7]
    # "5 6 7" (3 tokens) occurred at 0-2 and 8-10: the most recent, 8-10, is followed by 3 9 5
    assert look(tokens, 1, 3, 3) == [3, 9, 5]
    # at most 2 tokens: "6 7" last occurred at 9-10 as well
    assert look(tokens, 1, 2, 2) == [3, 9]
    # one token: "7" most recently at 10
    assert look(tokens, 1, 1, 1) == [3]


def test_bounds_room_and_no_match():
    tokens = [1, 2, 3, 4, 8, 2, 3]
    assert look(tokens, 3, 4, 4) == []  # "8 2 3" never occurred before; 2 tokens is below the minimum
    assert look(tokens, 2, 4, 4) == [4, 8, 2, 3]  # "2 3" at 1-2, then what followed, up to the end
    # past the tokens known the text is periodic ("2 3 4 8" again), and the drafts go on with it
    assert look(tokens, 2, 4, 9) == [4, 8, 2, 3, 4, 8, 2, 3, 4]
    assert look([4, 4, 4], 1, 5, 3) == [4, 4, 4]  # a run of one token drafts k of it
    assert look([1, 5, 6, 5, 6], 1, 4, 5) == [5, 6, 5, 6, 5]  # a loop of two: its next k
    assert look([7], 1, 3, 2) == [] and look([1, 2], 1, 3, 0) == []


def test_lane_tokens_grow_and_index_as_one_built_whole():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 20, 500).tolist()
    lane = LaneTokens(tokens[:100])
    lane.put(100, tokens[100:300])
    lane.put(250, tokens[250:500])  # those before 300 are known: only the rest is appended
    whole = LaneTokens(tokens)
    assert lane.length == whole.length == 500
    assert lane.buf[:500].tolist() == tokens and lane.prev[:500].tolist() == whole.prev[:500].tolist()
    assert lane.last == whole.last
    for i in (0, 37, 499):  # prev: the previous position of the same token
        earlier = [j for j in range(i) if tokens[j] == tokens[i]]
        assert lane.prev[i] == (earlier[-1] if earlier else -1)
    with pytest.raises(ValueError, match="gap"):
        lane.put(501, [1])


def test_a_lookup_agrees_with_a_plain_search_and_tries_a_bounded_number_of_occurrences():
    rng = np.random.default_rng(1)
    for _ in range(200):
        tokens = rng.integers(0, 6, int(rng.integers(2, 60))).tolist()
        min_n, max_n = sorted(rng.integers(1, 5, 2).tolist())
        want = []
        for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):  # longest first, most recent first
            ends = [e for e in range(n - 1, len(tokens) - 1) if tokens[e - n + 1: e + 1] == tokens[-n:]]
            if ends:
                follow = tokens[ends[-1] + 1: ends[-1] + 4]
                want = [follow[i % len(follow)] for i in range(3)]
                break
        assert look(tokens, min_n, max_n, 3) == want, (tokens, min_n, max_n)
    # a match older than the last token's CANDIDATES most recent occurrences is not tried
    old = [1, 2, 3, 9]
    assert look(old + [5, 3] * CANDIDATES + [1, 2, 3], 3, 3, 1) == []
    assert look(old + [5, 3] * (CANDIDATES - 1) + [1, 2, 3], 3, 3, 1) == [9]


class _Stub:
    """Enough of a model and its state for a drafter's bookkeeping (no forward runs)."""

    class cfg:
        vocab_size = 16

    kv_format = "bf16"


def test_a_lane_follows_its_request_through_rounds_and_a_resume():
    d = NgramDrafter(_Stub, _Stub, k=3, lookup_min=2, lookup_max=2)
    prompt = (1, 2, 3, 4, 1, 2)
    d.begin(0, prompt)
    ask = DraftAsk("r", 0, position=6, token_id=3, pages=(), room=3)  # the first sampled token goes in at 6
    assert d.draft([ask], []) == {"r": [4, 1, 2]}  # "2 3" occurred at 1-2
    d.keep(0, 6, None, [4, 9])  # the round accepted 4 and the target's own 9 followed it
    assert d.lanes[0].buf[: d.lanes[0].length].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 9]
    ask = DraftAsk("r", 0, position=8, token_id=9, pages=(), room=3)
    assert d.draft([ask], []) == {}  # "4 9" never occurred before
    # a preempted request starts again with its output: the lane picks up where it was
    d.forget(0)
    d.begin(1, prompt + (3, 4, 9))
    ask = DraftAsk("r", 1, position=8, token_id=9, pages=(), room=2)
    assert d.lanes[1].length == 9 and d.draft([ask], []) == {}
    assert d.draft([DraftAsk("s", 5, 3, 1, (), 2)], []) == {}  # a lane never begun drafts nothing
    sampled = DraftAsk("t", 2, position=6, token_id=3, pages=(), room=2, sampler=object())
    d.begin(2, prompt)
    assert d.draft([sampled], []) == {"t": [4, 1]} and d.draft_probs == {"t": [None, None]}  # point masses


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_greedy_output_is_plain_decode_with_long_accepts(checkpoint_factory, family, monkeypatch):
    """A tiny random model falls into loops that lookups predict: full accepts and rejections both happen.
    A round where no lookup hit runs as a plain one (on CUDA: its decode graph), never as a verify forward."""
    verified = []
    forward = spec_round.forward

    def counted(spec, model, state, plan, taking, drafts, *rest):
        verified.append(len(drafts))
        return forward(spec, model, state, plan, taking, drafts, *rest)

    monkeypatch.setattr(spec_round, "forward", counted)
    model, _ = load_model(checkpoint_factory(family).path)
    gen = torch.Generator().manual_seed(1)
    ps = [torch.randint(2, 128, (n,), generator=gen).tolist() for n in (5, 70, 23, 130, 9)]
    limits = [40, 7, 31, 2, 38]  # max_tokens cuts some lanes' drafts short
    want, _ = generate(model, None, ps, k=0, max_tokens=limits, sampling=GREEDY)
    for k in (1, 2, 4):
        got, accepted = generate(model, None, ps, k=k, max_tokens=limits, sampling=GREEDY,
                                 drafter=lambda m, s, k: NgramDrafter(m, s, k, 1, 3))
        assert got == want, f"K={k}"
        assert max(accepted) == k, f"K={k}: no round accepted all its drafts"
        assert sum(accepted) >= 15, f"K={k}: {sum(accepted)} accepted"
    assert verified and min(verified) > 0, "a round without drafts ran the verify forward"


def test_preempted_lanes_resume_their_lookups_with_plain_output(checkpoint_factory, monkeypatch):
    """A pool too small for every lane preempts a request; it resumes with its output in its lane's tokens."""
    model, _ = load_model(checkpoint_factory("qwen3_5").path)
    gen = torch.Generator().manual_seed(4)
    ps = [torch.randint(2, 128, (n,), generator=gen).tolist() for n in (60, 70, 50, 65)]
    want, _ = generate(model, None, ps, k=0, max_tokens=40, sampling=GREEDY, pages=7)
    resumed = []
    schedule = Scheduler.schedule

    def counted(self):
        plan = schedule(self)
        resumed.extend(s.req_id for s in plan.started if s.generated)
        return plan

    monkeypatch.setattr(Scheduler, "schedule", counted)
    got, accepted = generate(model, None, ps, k=3, max_tokens=40, sampling=GREEDY, pages=7,
                             drafter=lambda m, s, k: NgramDrafter(m, s, k, 1, 3))
    assert resumed, "no request was preempted and resumed"
    assert got == want and sum(accepted) > 0


def test_sampled_requests_draft_and_repeat_under_a_seed(checkpoint_factory):
    model, _ = load_model(checkpoint_factory("qwen3_5").path)
    gen = torch.Generator().manual_seed(2)
    ps = [torch.randint(2, 128, (n,), generator=gen).tolist() for n in (12, 40)]
    runs = [generate(model, None, ps, k=2, max_tokens=30, sampling={"temperature": 0.7, "seed": 5},
                     drafter=lambda m, s, k: NgramDrafter(m, s, k, 1, 3)) for _ in range(2)]
    assert runs[0][0] == runs[1][0] and all(len(v) == 30 for v in runs[0][0].values())


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_rounds_of_many_lanes_do_not_draft_under_disable_by_batch_size(checkpoint_factory, family, monkeypatch):
    """--speculative-disable-by-batch-size 3: rounds of 3 or more decoding lanes are plain; once fewer lanes
    are left, they draft again; the output is plain decode's. The head's drafter too: it skips rounds and
    takes in rows again when drafting resumes."""
    from tests.engine.spec_driver import load

    rounds = []
    draft = spec_round.draft

    def counted(spec, plan, takes, samplers):
        taking, drafts = draft(spec, plan, takes, samplers)
        rounds.append((len(plan.decodes), len(drafts)))
        return taking, drafts

    monkeypatch.setattr(spec_round, "draft", counted)
    model, head = load(checkpoint_factory(family, mtp="full").path)
    gen = torch.Generator().manual_seed(1)
    ps = [torch.randint(2, 128, (n,), generator=gen).tolist() for n in (5, 70, 23, 9)]
    limits = [40, 8, 16, 38]
    want, _ = generate(model, None, ps, k=0, max_tokens=limits, sampling=GREEDY)

    def lookup(m, s, k):
        d = NgramDrafter(m, s, k, 1, 3)
        d.disable_at = 3
        return d

    def mtp(m, s, k):
        d = SpecDecoder(m, head, s, k)
        d.disable_at = 3
        return d

    for make in (lookup, mtp):
        rounds.clear()
        got, accepted = generate(model, head, ps, k=2, max_tokens=limits, sampling=GREEDY, drafter=make)
        assert got == want, make.__name__
        assert rounds and all(lanes < 3 for lanes, _ in rounds), rounds  # no round of 3+ lanes drafted
        if make is lookup:
            assert sum(accepted) > 0, rounds
