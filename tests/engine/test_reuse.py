"""Prompt reuse end to end in one process: scheduler + store + runner on the demo model.

A resumed request must produce the logits of a cold prefill of the same
prompt (fp32, 1e-5 relative) and the same greedy tokens.
"""

from __future__ import annotations

import random

import pytest
import torch

from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE
from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.shared.sampling import SamplingParams

TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


class Engine:
    """The engine loop without sockets: schedule, run, update until every request ends."""

    def __init__(self, model, pages=64, lanes=4, device_slots=0, host_slots=8, reuse=True, kv_format="bf16",
                 exact_window=0, stamp="", prefill_budget=4096):
        self.sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                               max_prefill_tokens_per_round=prefill_budget,
                                               capture_inside_chunks=kv_format == "bf16"),
                               device_slots=device_slots, host_slots=host_slots, reuse=reuse, stamp=stamp)
        state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, fill=float("nan"),
                                    kv_format=kv_format, exact_window=exact_window)
        state.allocate_slots(device_slots, host_slots)
        self.runner = ModelRunner(model, state, vocab_limit=TOKENIZER_SIZE)
        self.first_logits: dict[str, torch.Tensor] = {}
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.finished = {}
        self.prefilled = 0  # prompt tokens every round's forward prefilled, summed

    def submit(self, rid, prompt, system_end=None, opener_start=None, last_is_user=True, cls="interactive",
               max_tokens=6, part_end=None, family=None, salt=None):
        from ignis.engine.request import capture_cuts

        req = Request(rid, tuple(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                      request_class=cls, system_end=system_end, opener_start=opener_start, part_end=part_end,
                      last_is_user=last_is_user, cache_family=family, cache_salt=salt,
                      must_cut_at=capture_cuts(len(prompt), system_end, opener_start, 64, part_end))
        assert self.sched.add(req) is None

    def run(self, logprobs=False):
        """Until every request ends; with ``logprobs``, also keeps each sampled token's logprob in
        ``self.logprobs`` (from the row it was sampled from)."""
        for _ in range(10_000):
            plan = self.sched.schedule()
            for ev in plan.finished:
                self.finished[ev.req_id] = ev
            if plan.is_empty:
                if not self.sched.has_work:
                    return
                continue
            self.prefilled += sum(c.num_tokens for c in plan.prefills)
            result, _ = self.runner.run(plan)
            for rid, row in self.runner.last_logits.items():
                self.first_logits.setdefault(rid, row.clone())
            for rid, tok in result.tokens.items():
                self.tokens.setdefault(rid, []).append(tok)
                if logprobs:
                    row = self.runner.last_logits[rid][:TOKENIZER_SIZE]
                    self.logprobs.setdefault(rid, []).append(float(torch.log_softmax(row, -1)[tok]))
            for ev in self.sched.update(result):
                self.finished[ev.req_id] = ev
                self.runner.release(ev.req_id)
        raise AssertionError("engine did not drain")

    def check_drained(self):
        self.sched.store.release_all()
        pool = self.sched.pool
        assert pool.num_free == pool.num_pages
        assert self.sched.store.slots.num_free == self.sched.store.slots.total
        pool.integrity_check()


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(TOKENIZER_SIZE) for _ in range(n)]


def rel(a, b):
    a, b = a[:TOKENIZER_SIZE], b[:TOKENIZER_SIZE]  # ids past the tokenizer are masked to -inf on both sides
    return float((a - b).abs().max() / b.abs().max())


def test_checkpoint_resume_matches_cold_prefill(model):
    p = prompt(203, 1)
    eng = Engine(model)
    eng.submit("a", p, system_end=130, opener_start=200)
    eng.run()
    kinds = sorted(e.kind for e in eng.sched.store.entries())
    assert kinds == ["prompt_checkpoint", "retained_prefix"]
    eng.submit("retry", p, system_end=130, opener_start=200)
    eng.run()
    ev = eng.finished["retry"]
    assert (ev.cached_tokens, ev.reuse_kind, ev.reuse_tier, ev.reuse_slot) == (200, "prompt_checkpoint", "device", "host")
    assert eng.finished["a"].cached_tokens == 0
    cold = Engine(model, reuse=False)
    cold.submit("cold", p)
    cold.run()
    err = rel(eng.first_logits["retry"], cold.first_logits["cold"])
    print(f"resumed vs cold rel err {err:.2e}")
    assert err < TOL
    assert eng.tokens["retry"] == cold.tokens["cold"] == eng.tokens["a"]
    eng.check_drained()


def test_forks_and_next_turn_hit_and_prefix_serves_a_sibling(model):
    system = prompt(150, 2)
    p = system + prompt(60, 3)
    eng = Engine(model)
    eng.submit("turn1", p, system_end=150, opener_start=207)
    eng.run()
    # two forks from the same point, at once: both hit, neither consumes the entry
    eng.submit("fork1", p + [5], system_end=150, opener_start=207)
    eng.submit("fork2", p + [6, 7], system_end=150, opener_start=207)
    eng.run()
    assert eng.finished["fork1"].cached_tokens == 207
    assert eng.finished["fork2"].cached_tokens == 207
    # a subagent with the same system block but a different task: the retained prefix (128 tokens)
    sib = system + prompt(40, 4)
    eng.submit("sibling", sib, system_end=150, opener_start=187)
    eng.run()
    assert eng.finished["sibling"].cached_tokens == 128
    assert eng.finished["sibling"].reuse_kind == "retained_prefix"
    cold = Engine(model, reuse=False)
    cold.submit("sibling", sib)
    cold.run()
    assert rel(eng.first_logits["sibling"], cold.first_logits["sibling"]) < TOL
    assert eng.tokens["sibling"] == cold.tokens["sibling"]
    eng.check_drained()


def test_no_slot_skips_capture_and_agent_never_evicts_interactive(model):
    eng = Engine(model, host_slots=1)
    eng.submit("i", prompt(100, 5), opener_start=97)
    eng.run()
    assert len(eng.sched.store) == 1
    eng.submit("ag", prompt(100, 6), opener_start=97, cls="agent")
    eng.run()
    assert [e.request_class for e in eng.sched.store.entries()] == ["interactive"]
    assert eng.sched.store.captures_skipped == 1
    eng.submit("i2", prompt(100, 7), opener_start=97)
    eng.run()
    assert [e.tokens[:3] for e in eng.sched.store.entries()] == [tuple(prompt(100, 7)[:3])]
    eng.check_drained()


@pytest.mark.parametrize("with_family", [True, False])
def test_a_cache_family_keeps_its_checkpoint_through_a_stranger_capture(model, with_family):
    """Two host slots: A's checkpoint is the older. A's next turn arrives with a stranger's first turn
    ahead of it; with its family named, A's checkpoint counts as used, the stranger takes B's slot and
    A's turn resumes (output equal to cold); without, the stranger takes A's slot and A recomputes."""
    fa, fb = ("fam-a", "fam-b") if with_family else (None, None)
    eng = Engine(model, host_slots=2)
    eng.submit("a1", prompt(100, 5), opener_start=97, family=fa)
    eng.run()
    eng.submit("b1", prompt(100, 6), opener_start=97, family=fb)
    eng.run()
    a2 = prompt(100, 5) + prompt(30, 9)
    eng.submit("c1", prompt(100, 7), opener_start=97)
    eng.submit("a2", a2, opener_start=len(a2) - 3, family=fa)
    eng.run()
    assert eng.finished["a2"].cached_tokens == (97 if with_family else 0)
    cold = Engine(model, reuse=False)
    cold.submit("a2", a2)
    cold.run()
    assert eng.tokens["a2"] == cold.tokens["a2"]
    eng.check_drained()


def test_retained_pages_never_refuse_an_admission(model):
    eng = Engine(model, pages=8, lanes=2, host_slots=8)
    for i in range(3):
        eng.submit(f"r{i}", prompt(130, 10 + i), system_end=128, opener_start=127)
        eng.run()
    assert eng.sched.store.stats()["retained_pages_held"] > 0
    big = prompt(8 * 64 - 20, 20)
    eng.submit("big", big, max_tokens=4)
    eng.run()
    assert eng.finished["big"].reason == "length"
    assert len(eng.tokens["big"]) == 4
    eng.check_drained()


def test_reuse_off_captures_nothing(model):
    eng = Engine(model, reuse=False)
    p = prompt(150, 30)
    eng.submit("a", p, system_end=100, opener_start=140)
    eng.submit("b", p, system_end=100, opener_start=140)
    eng.run()
    assert len(eng.sched.store) == 0
    assert eng.finished["b"].cached_tokens == 0
    eng.check_drained()


def test_simultaneous_burst_reads_the_shared_block_once(model):
    block = prompt(300, 40)
    eng = Engine(model, pages=128, lanes=8, host_slots=16)
    for i in range(8):
        p = block + prompt(40, 50 + i)
        eng.submit(f"sub{i}", p, system_end=300, opener_start=len(p) - 3, cls="agent")
    eng.run()
    cached = sorted(eng.finished[f"sub{i}"].cached_tokens for i in range(8))
    assert cached == [0] + [256] * 7
    cold = Engine(model, reuse=False)
    cold.submit("sub3", block + prompt(40, 53))
    cold.run()
    assert eng.tokens["sub3"] == cold.tokens["sub3"]
    eng.check_drained()


@pytest.mark.parametrize("slot_tier", ["device", "host"])
def test_an_image_saved_and_loaded_on_another_lane_matches_cold_prefill(model, slot_tier):
    """Captured on lane 1 while lane 0 runs another prompt, resumed on lane 1 while lane 0 runs a third:
    the image is the capturing lane's, and it lands in the resuming lane (a device slot, or a host slot)."""
    device_slots, host_slots = (4, 1) if slot_tier == "device" else (0, 4)
    p = prompt(203, 60)
    eng = Engine(model, lanes=2, device_slots=device_slots, host_slots=host_slots)
    eng.submit("other", prompt(230, 61))
    eng.submit("a", p, opener_start=200)
    eng.run()
    assert [e.kind for e in eng.sched.store.entries()] == ["prompt_checkpoint"]
    eng.submit("third", prompt(260, 62))
    eng.submit("retry", p, opener_start=200)
    eng.run()
    ev = eng.finished["retry"]
    assert (ev.cached_tokens, ev.reuse_kind, ev.reuse_slot) == (200, "prompt_checkpoint", slot_tier)
    cold = Engine(model, lanes=1, reuse=False)
    cold.submit("cold", p)
    cold.run()
    err = rel(eng.first_logits["retry"], cold.first_logits["cold"])
    print(f"{slot_tier} slot, lane 1: resumed vs cold rel err {err:.2e}")
    assert err < TOL
    assert eng.tokens["retry"] == cold.tokens["cold"] == eng.tokens["a"]
    eng.check_drained()
