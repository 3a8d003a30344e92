"""Logits only for the rows sampled: the LM head never runs on a prefill's other positions."""

from __future__ import annotations

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.shared.demo.builder import model_config
from ignis.shared.sampling import SamplingParams

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HybridModel(config_from_dict(model_config(VOCAB, eos_id=1, pad_id=0))).eval()


class HeadRows:
    """Wraps a model's ``head`` and records how many rows each call was given."""

    def __init__(self, model):
        self.calls: list[int] = []
        self.inner = model.head

    def __call__(self, x):
        self.calls.append(int(x.shape[0]))
        return self.inner(x)


def state_for(model, lanes=4, pages=16):
    return ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32)


def mixed_chunks(sampled_prefill: bool) -> list[SeqChunk]:
    """Two single-token sequences, a 70-token chunk that does not end its prompt, a 5-token one that does."""
    return [SeqChunk([5], 0, [0], 0), SeqChunk([6], 0, [1], 1),
            SeqChunk(list(range(10, 80)), 0, [2, 3], 2, sampled=sampled_prefill), SeqChunk([7, 8, 9, 10, 11], 0, [4], 3)]


def test_logits_indices_name_the_last_token_of_each_sampled_sequence():
    batch = ForwardBatch.build(mixed_chunks(sampled_prefill=False))
    assert batch.logits_indices.tolist() == [0, 1, 76]
    assert ForwardBatch.build(mixed_chunks(sampled_prefill=True)).logits_indices.tolist() == [0, 1, 71, 76]


def test_the_head_runs_on_the_sampled_rows_only_and_they_match_every_token_logits(model, monkeypatch):
    every = model(ForwardBatch.build(mixed_chunks(True)), state_for(model), all_logits=True)
    rows = HeadRows(model)
    monkeypatch.setattr(model, "head", rows)
    got = model(ForwardBatch.build(mixed_chunks(False)), state_for(model))
    assert rows.calls == [3]
    assert got.shape == (3, VOCAB)
    torch.testing.assert_close(got, every[[0, 1, 76]], rtol=1e-5, atol=1e-5)


def test_a_round_that_samples_nothing_runs_no_head_rows(model, monkeypatch):
    rows = HeadRows(model)
    monkeypatch.setattr(model, "head", rows)
    out = model(ForwardBatch.build([SeqChunk(list(range(64)), 0, [0], 0, sampled=False)]), state_for(model))
    assert out.shape == (0, VOCAB) and rows.calls == [0]


def test_runner_rounds_give_the_head_one_row_per_sampled_id(model, monkeypatch):
    lanes, pages = 4, 32
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                      max_prefill_tokens_per_round=96), reuse=False)
    limit = VOCAB - 12  # ids past the tokenizer: masked in the forward's own output, never drawn
    runner = ModelRunner(model, state_for(model, lanes, pages), vocab_limit=limit)
    rows = HeadRows(model)
    monkeypatch.setattr(model, "head", rows)
    for i, n in enumerate((300, 40, 130)):
        params = SamplingParams(temperature=0.0 if i else 0.8, seed=i, max_tokens=3, ignore_eos=True)
        assert sched.add(Request(f"r{i}", tuple(range(2, 2 + n)), params)) is None
    unsampled_chunks = 0
    for _ in range(200):
        plan = sched.schedule()
        if plan.is_empty:
            if not sched.has_work:
                break
            continue
        unsampled_chunks += sum(not c.is_last for c in plan.prefills)
        result, _ = runner.run(plan)
        assert rows.calls[-1] == len(plan.sampled_ids()) == len(result.tokens)
        assert set(runner.last_logits) == set(plan.sampled_ids())
        assert all(bool(torch.isinf(row[limit:]).all()) for row in runner.last_logits.values())
        assert all(t < limit for t in result.tokens.values())
        for ev in sched.update(result):
            runner.release(ev.req_id)
    else:
        raise AssertionError("the requests did not finish")
    assert unsampled_chunks >= 3  # the 300- and 130-token prompts are prefilled over several rounds
    assert sum(rows.calls) == 3 * 3  # three tokens per request, one head row each
