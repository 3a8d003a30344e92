"""Prompt logprobs: each prompt token scored as a whole forward over the prompt scores it, once."""

from __future__ import annotations

import random

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.engine.prompt_scores import PromptScoring
from ignis.engine.request import Request, capture_cuts
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.shared.demo.builder import model_config
from ignis.shared.sampling import SamplingParams

VOCAB = 512
LIMIT = VOCAB - 12  # ids past the tokenizer: never scored as alternatives
TOP = 3


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HybridModel(config_from_dict(model_config(VOCAB, eos_id=1, pad_id=0))).eval()


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(2, LIMIT) for _ in range(n))


def reference(model, ids: tuple[int, ...]) -> torch.Tensor:
    """log-softmax rows [len - 1, vocab] of one whole forward over ``ids`` (row q predicts token q + 1)."""
    pages = -(-len(ids) // 64)
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=1, dtype=torch.float32)
    logits = model(ForwardBatch.build([SeqChunk(list(ids), 0, list(range(pages)), 0)]), state, all_logits=True)
    logits = logits[:-1].float().clone()
    logits[:, LIMIT:] = float("-inf")
    return torch.log_softmax(logits, -1)


class Loop:
    """Scheduler and runner without sockets; keeps every round's prompt scores."""

    def __init__(self, model, budget=96, lanes=4, pages=64, device_slots=0):
        self.sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                               max_prefill_tokens_per_round=budget), device_slots=device_slots,
                               host_slots=0, reuse=device_slots > 0)
        state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, fill=float("nan"))
        state.allocate_slots(device_slots, 0)
        self.runner = ModelRunner(model, state, vocab_limit=LIMIT)
        self.scores: dict[str, list] = {}
        self.tokens: dict[str, list[int]] = {}
        self.done = {}

    def submit(self, rid, ids, scores: int | None, max_tokens=4, system_end=None):
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=scores)
        assert self.sched.add(Request(rid, ids, sampling, system_end=system_end, opener_start=len(ids) - 2,
                                      must_cut_at=capture_cuts(len(ids), system_end, len(ids) - 2, 64, None))) is None

    def run(self):
        for _ in range(1000):
            plan = self.sched.schedule()
            if plan.is_empty:
                if not self.sched.has_work:
                    return
                continue
            result, _ = self.runner.run(plan)
            for rid, msgs in result.prompt_logprobs.items():
                assert rid not in self.tokens, "prompt scores come before the request's first token"
                self.scores.setdefault(rid, []).extend(msgs)
            for rid, tok in result.tokens.items():
                self.tokens.setdefault(rid, []).append(tok)
            for ev in self.sched.update(result):
                self.done[ev.req_id] = ev
                self.runner.release(ev.req_id)
        raise AssertionError("the requests did not finish")


def flatten(msgs) -> tuple[list[float], list[int], list[tuple[int, ...]], list[tuple[float, ...]]]:
    """The scores of positions 1, 2, ... in order (each message starting where the last ended)."""
    lps, ranks, top_ids, top_lps, at = [], [], [], [], 1
    for m in msgs:
        assert m.start == at
        lps += m.logprobs.logprobs
        ranks += m.ranks
        top_ids += m.logprobs.top_ids
        top_lps += m.logprobs.top_logprobs
        at += len(m.ranks)
    return lps, ranks, top_ids, top_lps


def check_against_reference(model, ids, msgs):
    ref = reference(model, ids)
    lps, ranks, top_ids, top_lps = flatten(msgs)
    assert len(lps) == len(ids) - 1
    targets = torch.tensor(ids[1:])
    chosen = ref.gather(1, targets.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(lps), chosen, rtol=0, atol=1e-4)
    want_ranks = ((ref > chosen.unsqueeze(1) + 1e-4).sum(1) + 1).tolist()
    loose_ranks = ((ref > chosen.unsqueeze(1) - 1e-4).sum(1) + 1).tolist()
    assert all(lo <= r <= hi for lo, r, hi in zip(want_ranks, ranks, loose_ranks))
    vals, idx = torch.topk(ref, TOP, -1)
    torch.testing.assert_close(torch.tensor(top_lps), vals, rtol=0, atol=1e-4)
    assert all(max(i) < LIMIT for i in top_ids)
    same = sum(tuple(a) == tuple(b) for a, b in zip(top_ids, idx.tolist()))
    assert same >= len(top_ids) - 2  # a near tie may swap two alternatives


@pytest.mark.parametrize("budget", [96, 1000])
def test_scores_equal_a_whole_forward_beside_decodes(model, budget):
    loop = Loop(model, budget=budget)
    loop.submit("plain", prompt(40, 1), None, max_tokens=30)
    ids = prompt(300, 2)
    loop.submit("scored", ids, TOP)
    loop.submit("short", prompt(2, 3), 0)
    loop.run()
    check_against_reference(model, ids, loop.scores["scored"])
    assert len(loop.scores["scored"]) >= (300 // budget)  # one message per chunk at least
    lps, ranks, top_ids, _ = flatten(loop.scores["short"])
    assert len(lps) == 1 and top_ids == [()] and ranks[0] >= 1
    assert "plain" not in loop.scores
    assert len(loop.tokens["scored"]) == 4


def test_a_scoring_request_resumes_nothing_and_its_scores_match(model):
    ids = prompt(260, 4)
    loop = Loop(model, budget=4096, device_slots=4)
    loop.submit("first", ids, None, system_end=200)
    loop.run()
    loop.submit("scored", ids, TOP, system_end=200)
    loop.run()
    loop.submit("again", ids, None, system_end=200)
    loop.run()
    assert loop.done["again"].cached_tokens > 0  # the store held the prompt: a plain request resumes from it
    assert loop.done["scored"].cached_tokens == 0
    check_against_reference(model, ids, loop.scores["scored"])
    assert loop.tokens["scored"] == loop.tokens["first"] == loop.tokens["again"]


def test_a_recomputed_chunk_is_not_scored_twice():
    scoring = PromptScoring(vocab_size=16)
    ids = tuple(range(1, 11))
    scoring.start("r", ids, 2)
    hidden = torch.randn(10, 16)

    def head(rows):
        return rows

    got = scoring.score("r", 0, 4, hidden[:4], head)
    assert [(m.start, len(m.ranks)) for m in got] == [(1, 4)]
    scoring.start("r", ids, 2)  # resumed after a preemption: keeps its progress
    assert scoring.score("r", 0, 4, hidden[:4], head) == []  # recomputed from the start
    got = scoring.score("r", 0, 10, hidden, head)
    assert [(m.start, len(m.ranks)) for m in got] == [(5, 5)]  # tokens 5..9; row 9 would score the output
    assert not scoring.wants("r")
    assert scoring.score("r", 0, 10, hidden, head) == []


def test_slices_bound_the_rows_the_head_takes_at_once():
    scoring = PromptScoring(vocab_size=16)
    scoring.rows_per_slice = 3
    ids = tuple(range(1, 9))
    scoring.start("r", ids, 0)
    calls = []

    def head(rows):
        calls.append(rows.shape[0])
        return rows

    msgs = scoring.score("r", 0, 8, torch.randn(8, 16), head)
    assert calls == [3, 3, 1] and [m.start for m in msgs] == [1, 4, 7]
    assert all(t == () for m in msgs for t in m.logprobs.top_ids)


def test_one_token_prompts_and_unasked_requests_score_nothing():
    scoring = PromptScoring(vocab_size=16)
    scoring.start("one", (5,), 2)
    scoring.start("none", (5, 6, 7), None)
    assert not scoring.wants("one") and not scoring.wants("none")
