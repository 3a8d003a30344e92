"""One request whose sampling fails ends with "error"; the round's other requests and the loop go on.

Scheduler + runner on the demo model (the engine loop without sockets). One
request's sampler is replaced, after its first token, by one that raises:
that request ends with "error" and frees its lane and pages; the request
beside it gives exactly the tokens it gives alone. A request whose sampler
cannot even be set up ends the same way.
"""

from __future__ import annotations

import pytest

from ignis.engine.models.build import load_model
from ignis.engine.request import Request
from ignis.engine.sampling import SamplerState
from ignis.shared.demo import ensure_demo_model
from ignis.shared.sampling import SamplingParams
from tests.engine.test_reuse import Engine, prompt


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


class Broken:
    """A sampler state whose every use raises."""

    def __getattr__(self, name):
        raise RuntimeError(f"broken sampler state ({name})")


def run_with_broken(eng: Engine, broken_id: str, max_rounds: int = 200) -> None:
    for _ in range(max_rounds):
        plan = eng.sched.schedule()
        for ev in plan.finished:
            eng.finished[ev.req_id] = ev
            eng.runner.release(ev.req_id)
        if plan.is_empty:
            if not eng.sched.has_work:
                return
            continue
        eng.runner._start(plan)  # set up samplers, then break one before the round samples
        if broken_id in eng.runner.samplers:
            eng.runner.samplers[broken_id] = Broken()
        result, _ = eng.runner.run(plan)
        for rid, tok in result.tokens.items():
            if rid not in result.errors:
                eng.tokens.setdefault(rid, []).append(tok)
        for ev in eng.sched.update(result):
            eng.finished[ev.req_id] = ev
            eng.runner.release(ev.req_id)
    raise AssertionError("engine did not drain")


def test_a_failing_sampler_ends_only_its_request(model):
    solo = Engine(model, reuse=False)
    solo.submit("good", prompt(150, 3), max_tokens=6)
    solo.run()

    eng = Engine(model, reuse=False)
    eng.submit("good", prompt(150, 3), max_tokens=6)
    eng.submit("bad", prompt(90, 4), max_tokens=6)
    run_with_broken(eng, "bad")
    bad, good = eng.finished["bad"], eng.finished["good"]
    assert bad.reason == "error" and "sampling its token" in bad.message and bad.error_code == ""  # the engine's
    # its first token came from the sampler set up at its start; the broken one fails its first decode
    assert bad.completion_tokens == len(eng.tokens["bad"]) == 1
    assert good.reason == "length" and eng.tokens["good"] == solo.tokens["good"]
    eng.check_drained()


def _add(eng: Engine, rid: str, tokens: list[int], **sampling) -> None:
    params = SamplingParams(max_tokens=6, ignore_eos=True, **sampling)
    assert eng.sched.add(Request(rid, tuple(tokens), params)) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constraints_that_leave_no_token_end_their_request_and_seeded_neighbours_draw_as_alone(model, temperature):
    """A request whose allowed ids are all bad words has no token to sample: it ends with an error that says
    so, and a seeded request sampled in the same rows (before it and after it) draws what it draws alone:
    each row's key is drawn once."""
    seeded = {"temperature": 0.9, "seed": 11}
    solo = Engine(model, reuse=False)
    _add(solo, "before", prompt(120, 3), **seeded)
    _add(solo, "after", prompt(100, 5), **seeded)
    run_with_broken(solo, "none")

    eng = Engine(model, reuse=False)
    _add(eng, "before", prompt(120, 3), **seeded)
    _add(eng, "stuck", prompt(90, 4), temperature=temperature, allowed_token_ids=(7,), bad_words=((7,),))
    _add(eng, "after", prompt(100, 5), **seeded)
    run_with_broken(eng, "none")
    stuck = eng.finished["stuck"]
    assert stuck.reason == "error" and "leave no token to sample" in stuck.message, stuck
    assert stuck.error_code == "invalid_request"  # the client's error: a 400, not retried
    assert "stuck" not in eng.tokens
    assert eng.tokens["before"] == solo.tokens["before"] and eng.tokens["after"] == solo.tokens["after"]
    eng.check_drained()


def test_a_sampler_that_cannot_be_set_up_ends_only_its_request(model, monkeypatch):
    real = SamplerState.from_params.__func__

    def from_params(cls, params, prompt_ids, eos_ids=()):
        if len(prompt_ids) == 90:
            raise ValueError("bad sampling parameters")
        return real(cls, params, prompt_ids, eos_ids)

    monkeypatch.setattr(SamplerState, "from_params", classmethod(from_params))
    eng = Engine(model, reuse=False)
    eng.submit("good", prompt(150, 3), max_tokens=6)
    eng.submit("bad", prompt(90, 4), max_tokens=6)
    run_with_broken(eng, "none")
    assert eng.finished["bad"].reason == "error" and eng.finished["good"].reason == "length"
    assert len(eng.tokens["good"]) == 6
    eng.check_drained()
