"""An aborted prefill leaves what it computed (engine.prefill_chunks.capture_aborted): a retry resumes
there with the cold answer, also when the aborted request's lane goes to another request in the same
round (its pages are held until the round is applied); a prefill that got little past its last resumable point leaves nothing."""

from __future__ import annotations

from ignis.engine.prefill_chunks import ABORT_CAPTURE_MIN_PAGES
from ignis.engine.request import RequestState
from tests.engine.test_reuse import TOL, Engine, model, prompt, rel  # noqa: F401 (model: a fixture)


def prefill_until(eng: Engine, rid: str, tokens: int) -> None:
    """Run rounds until ``rid`` has computed at least ``tokens`` prompt tokens (still prefilling)."""
    for _ in range(100):
        req = eng.sched.get(rid)
        if req is not None and req.num_computed_tokens >= tokens:
            assert req.state is RequestState.PREFILLING
            return
        plan = eng.sched.schedule()
        result, _ = eng.runner.run(plan)
        for ev in eng.sched.update(result):
            eng.finished[ev.req_id] = ev
            eng.runner.release(ev.req_id)
    raise AssertionError(f"{rid} never reached {tokens} tokens")


def test_a_retry_of_an_aborted_prefill_resumes_where_it_stopped_with_the_cold_answer(model):
    p = prompt(900, 31)
    other = prompt(300, 32)
    eng = Engine(model, pages=40, lanes=1, prefill_budget=100)
    eng.submit("a", p, opener_start=897)
    eng.submit("b", other, opener_start=297)  # waits for the one lane: takes a's lane and pages next round
    prefill_until(eng, "a", 600)
    eng.sched.abort("a")
    plan = eng.sched.schedule()
    assert [ev.req_id for ev in plan.finished] == ["a"] and [s.req_id for s in plan.started] == ["b"]
    assert [o.before_round for o in plan.captures] == [True]
    ((src, _),) = plan.captures[0].page_copies  # 600 tokens end inside a page: its private copy is made first
    b_pages = set(eng.sched.get("b").page_table.pages)
    assert eng.sched.pool.refcount(src) == 1 and src not in b_pages  # held for the copy, not handed on
    assert plan.computes
    eng.finished.update((ev.req_id, ev) for ev in plan.finished)
    result, _ = eng.runner.run(plan)
    for rid, row in eng.runner.last_logits.items():
        eng.first_logits.setdefault(rid, row.clone())
    for rid, tok in result.tokens.items():
        eng.tokens.setdefault(rid, []).append(tok)
    eng.finished.update((ev.req_id, ev) for ev in eng.sched.update(result))
    assert eng.sched.pool.refcount(src) == 0  # the round is applied: back in the pool
    eng.run()
    assert eng.finished["a"].reason == "abort"
    (entry,) = [e for e in eng.sched.store.entries() if e.kind == "aborted_prefill"]
    assert entry.num_tokens == 600
    eng.submit("retry", p, opener_start=897)
    eng.run()
    ev = eng.finished["retry"]
    assert (ev.cached_tokens, ev.reuse_kind) == (600, "aborted_prefill")
    cold = Engine(model, reuse=False)
    cold.submit("cold", p)
    cold.submit("cold-b", other)
    cold.run()
    assert rel(eng.first_logits["retry"], cold.first_logits["cold"]) < TOL
    assert eng.tokens["retry"] == cold.tokens["cold"]
    assert rel(eng.first_logits["b"], cold.first_logits["cold-b"]) < TOL  # b's forward ran on a's lane
    assert eng.tokens["b"] == cold.tokens["cold-b"]
    eng.check_drained()


def test_a_prefill_aborted_close_to_its_last_mark_leaves_nothing(model):
    p = prompt(900, 33)
    eng = Engine(model, pages=40, lanes=1, prefill_budget=100)
    eng.submit("a", p, system_end=256, opener_start=897)  # a mark at 256: 500 is 244 tokens past it
    prefill_until(eng, "a", 500)
    assert 500 - 256 < ABORT_CAPTURE_MIN_PAGES * 64
    eng.sched.abort("a")
    eng.run()
    assert [e.kind for e in eng.sched.store.entries()] == ["retained_prefix"]
    eng.check_drained()


def test_reuse_off_keeps_no_aborted_prefill(model):
    eng = Engine(model, pages=40, lanes=1, prefill_budget=100, reuse=False)
    eng.submit("a", prompt(900, 34), opener_start=897)
    prefill_until(eng, "a", 700)
    eng.sched.abort("a")
    eng.run()
    assert not list(eng.sched.store.entries())
    eng.check_drained()


def test_a_request_waits_a_round_for_the_held_pages_instead_of_counting_itself_short(model):
    """The aborted prefill's pages come back when the round is applied: a head of the queue that fits with
    them waits that round without asking for an eviction or a preemption (``pages_wanted`` stays 0)."""
    eng = Engine(model, pages=24, lanes=2, prefill_budget=100)
    eng.submit("a", prompt(900, 35), opener_start=897)
    prefill_until(eng, "a", 600)
    eng.submit("c", prompt(700, 36), opener_start=697)  # 11 pages: more than are free beside a's
    c = eng.sched.get("c")
    eng.sched.abort("a")
    plan = eng.sched.schedule()
    held = eng.sched.store.pages_coming
    assert [ev.req_id for ev in plan.finished] == ["a"] and not plan.started
    assert eng.sched.pool.num_free < 11 <= eng.sched.pool.num_free + held  # a's pages past its capture
    assert c.state is RequestState.WAITING and c.pages_wanted == 0 and not plan.preempted
    eng.finished.update((ev.req_id, ev) for ev in eng.sched.update(eng.runner.run(plan)[0]))
    assert eng.sched.store.pages_coming == 0
    plan = eng.sched.schedule()
    assert [s.req_id for s in plan.started] == ["c"]
    eng.finished.update((ev.req_id, ev) for ev in eng.sched.update(eng.runner.run(plan)[0]))
    eng.run()
    assert eng.finished["c"].reason in ("stop", "length")
    eng.check_drained()


def test_the_held_pages_spare_a_retained_entry_the_head_would_otherwise_evict(model):
    """Room on its way counts before retained entries are reclaimed: with the held pages enough for the
    head, an unrelated retained entry stays (it served its conversation's next turn)."""
    eng = Engine(model, pages=24, lanes=2, prefill_budget=100)
    eng.submit("b", prompt(140, 40), opener_start=137, max_tokens=2)
    eng.run()
    kept = {e.tokens for e in eng.sched.store.entries()}
    assert kept
    eng.submit("a", prompt(900, 35), opener_start=897)
    prefill_until(eng, "a", 600)
    eng.submit("c", prompt(700, 36), opener_start=697)
    eng.sched.abort("a")
    plan = eng.sched.schedule()
    c = eng.sched.get("c")
    assert c.state is RequestState.WAITING and c.pages_wanted == 0 and not plan.started
    assert eng.sched.pool.num_free < 11 <= eng.sched.pool.num_free + eng.sched.store.pages_coming
    assert kept <= {e.tokens for e in eng.sched.store.entries()}, "reclaimed though the held pages cover it"
    eng.finished.update((ev.req_id, ev) for ev in eng.sched.update(eng.runner.run(plan)[0]))
    eng.run()
    assert eng.finished["c"].reason in ("stop", "length")
    eng.check_drained()
