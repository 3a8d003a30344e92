"""Learned capture points and shortfall reasons: the token-only index alone, then in the scheduler."""

from __future__ import annotations

import sys

import pytest

from ignis.engine.request import Request
from ignis.engine.reuse.hashing import page_chain
from ignis.engine.reuse.learned_points import LearnedPoints
from ignis.engine.reuse.shortfall import Fates, shortfall_reason
from ignis.engine.schedule import RoundResult
from ignis.engine.scheduler import Scheduler
from ignis.shared.sampling import SamplingParams
from tests.engine.test_scheduler import assert_drained, config

PT = 64


def prompt(shared: int, tail: int, tag: int) -> tuple[int, ...]:
    """``shared`` tokens common to every tag, then ``tail`` tokens of this tag's own."""
    return tuple(range(1, shared + 1)) + tuple(10_000 * tag + i for i in range(tail))


# ----- the index ------------------------------------------------------------------------


def test_a_new_prompt_learns_the_page_where_it_diverges():
    idx = LearnedPoints(PT)
    first = idx.observe(prompt(200, 50, 1), cuts=())
    assert (first.shared_tokens, first.learned_at, first.earlier_cuts) == (0, None, ())
    second = idx.observe(prompt(200, 50, 2), cuts=(247,))
    assert (second.shared_tokens, second.learned_at) == (192, 192)  # 3 whole pages, not 200 tokens
    assert second.earlier_cuts == ()
    third = idx.observe(prompt(200, 50, 3), cuts=())
    assert third.shared_tokens == 192 and third.earlier_cuts == (192, 247)  # the newest holder's points
    assert third.learned_at is None  # the second request captures there already
    idx.check()


@pytest.mark.parametrize("cuts,learned", [
    ((), 192),
    ((100,), 192),  # a point two pages short still leaves a page to learn
    ((129,), None),  # within a page of the divergence: its own point suffices
    ((192,), None),
    ((230,), 192),  # past the shared prefix: it does not count
])
def test_own_capture_points_inside_the_shared_prefix_suppress_the_learned_one(cuts, learned):
    idx = LearnedPoints(PT)
    idx.observe(prompt(200, 50, 1), cuts=())
    assert idx.observe(prompt(200, 50, 2), cuts=cuts).learned_at == learned


def test_an_earlier_point_near_the_divergence_suppresses_it_too():
    """The next turn of a conversation shares the last one's prompt up to a few tokens past its opener:
    the opener, a capture point already, covers it."""
    idx = LearnedPoints(PT)
    idx.observe(prompt(129, 0, 1), cuts=(126,))  # opener at 126, prompt ends at 129
    seen = idx.observe(prompt(129, 80, 2), cuts=(205,))
    assert (seen.shared_tokens, seen.learned_at) == (128, None)
    idx.observe(prompt(300, 0, 3), cuts=(40,))  # an early point only
    assert idx.observe(prompt(300, 80, 4), cuts=()).learned_at == 256


def test_divergence_is_counted_in_whole_pages():
    idx = LearnedPoints(PT)
    idx.observe(prompt(63, 100, 1), cuts=())
    assert idx.observe(prompt(63, 100, 2), cuts=()).shared_tokens == 0  # differs inside the first page
    idx.observe(prompt(128, 100, 1), cuts=())
    seen = idx.observe(prompt(128, 100, 2), cuts=())
    assert (seen.shared_tokens, seen.learned_at) == (128, 128)


def test_a_repeated_prompt_never_cuts_at_its_own_end():
    idx = LearnedPoints(PT)
    p = tuple(range(1, 257))  # exactly 4 pages
    idx.observe(p, cuts=())
    seen = idx.observe(p, cuts=())
    assert seen.shared_tokens == 256 and seen.learned_at is None


def test_bounded_by_prompts_oldest_evicted_first():
    idx = LearnedPoints(PT, max_prompts=2)
    idx.observe(prompt(128, 64, 1), cuts=())  # A
    idx.observe(prompt(0, 256, 2), cuts=())  # B: shares nothing with A
    idx.observe(prompt(0, 256, 3), cuts=())  # C evicts A
    assert len(idx) == 2 and idx.num_pages == 8
    idx.check()
    assert idx.observe(prompt(128, 64, 4), cuts=()).shared_tokens == 0  # A's pages are gone
    assert idx.observe(prompt(0, 256, 3), cuts=()).shared_tokens == 256  # C's stay
    idx.check()


def test_bounded_by_pages_and_shared_pages_survive_their_first_owner():
    idx = LearnedPoints(PT, max_prompts=100, max_pages=10)
    idx.observe(prompt(256, 64, 1), cuts=())  # A: 5 pages
    idx.observe(prompt(256, 64, 2), cuts=())  # B: 5 pages, the first 4 shared with A
    assert idx.num_pages == 10
    idx.observe(prompt(0, 64, 3), cuts=())  # 1 page more: A goes
    assert len(idx) == 2 and idx.num_pages == 6
    idx.check()
    assert idx.observe(prompt(256, 64, 5), cuts=()).shared_tokens == 256  # B still holds them
    idx.check()


def test_a_prompt_longer_than_the_page_bound_keeps_its_first_pages():
    idx = LearnedPoints(PT, max_pages=4)
    idx.observe(tuple(range(1, 641)), cuts=())
    assert idx.num_pages == 4
    assert idx.observe(tuple(range(1, 641)), cuts=()).shared_tokens == 256
    idx.check()


def test_memory_stays_flat_over_many_prompts():
    idx = LearnedPoints(PT, max_prompts=16, max_pages=64)
    for tag in range(500):
        idx.observe(prompt(64 * (tag % 7), 300, tag), cuts=(5,))
        assert len(idx) <= 16 and idx.num_pages <= 64
    idx.check()
    assert len(idx._owner) <= 64
    assert sys.getsizeof(idx._owner) < 16_384


def test_shared_bisects_the_chain():
    idx = LearnedPoints(PT)
    idx.observe(prompt(320, 10, 1), cuts=(7,))
    hashes = page_chain(prompt(320, 200, 2), PT)
    assert idx.shared(hashes) == (5, (7,))
    assert idx.shared(page_chain(prompt(0, 400, 9), PT)) == (0, ())


def test_bad_bounds_raise():
    with pytest.raises(ValueError):
        LearnedPoints(0)
    with pytest.raises(ValueError):
        LearnedPoints(64, max_prompts=0)


# ----- shortfall reasons -------------------------------------------------------------------


def test_shortfall_reasons():
    fates = Fates()
    p = tuple(range(1, 400))
    assert shortfall_reason(p, 0, 0, (), fates, PT) == "unseen"
    assert shortfall_reason(p, 200, 256, (200,), fates, PT) == "none"  # less than a page short
    assert shortfall_reason(p, 0, 256, (), fates, PT) == "no_mark"
    assert shortfall_reason(p, 0, 256, (300,), fates, PT) == "no_mark"  # past the shared prefix
    assert shortfall_reason(p, 0, 256, (100, 250), fates, PT) == "not_ready"
    fates.note(p[:250], "evicted")
    assert shortfall_reason(p, 0, 256, (100, 250), fates, PT) == "evicted"
    fates.note(p[:250], "budget")
    assert shortfall_reason(p, 0, 256, (100, 250), fates, PT) == "budget"
    fates.note(p[:100], "slot_busy")
    assert shortfall_reason(p, 0, 256, (100,), fates, PT) == "slot_busy"
    # a checkpoint at a generation opener, mid-page past the whole pages shared: its fate, not no_mark
    fates.note(p[:290], "evicted")
    assert shortfall_reason(p, 0, 256, (290,), fates, PT) == "evicted"
    assert shortfall_reason(p[:270] + (0,) * 129, 0, 256, (290,), fates, PT) == "no_mark"  # not this prompt's
    assert shortfall_reason(p, 0, 256, (330,), fates, PT) == "no_mark"  # a page past: not known to be shared
    # a turn sent again after its conversation went on: the newest prompt sharing its pages planned no cut
    # there, but this prompt's own opener is where its earlier send's checkpoint was, dropped by the budget
    fates.note(p[:295], "budget")
    assert shortfall_reason(p, 0, 256, (), fates, PT) == "no_mark"
    assert shortfall_reason(p, 0, 256, (), fates, PT, own_cuts=(295,)) == "budget"
    assert shortfall_reason(p, 0, 256, (), fates, PT, own_cuts=(200,)) == "no_mark"  # no fate noted there
    fates.note(p[:120], "evicted")  # an own cut inside the shared prefix: read where no earlier prompt cut
    assert shortfall_reason(p, 0, 256, (), fates, PT, own_cuts=(120,)) == "evicted"
    assert shortfall_reason(p, 0, 256, (150,), fates, PT, own_cuts=(120,)) == "not_ready"  # the earlier's first
    with pytest.raises(ValueError):
        fates.note(p, "lost")


def test_fates_are_bounded_newest_kept():
    fates = Fates(limit=3)
    for n in range(1, 6):
        fates.note(tuple(range(n)), "evicted")
    assert len(fates) == 3
    assert fates.of(tuple(range(1))) is None and fates.of(tuple(range(5))) == "evicted"


# ----- in the scheduler ----------------------------------------------------------------------


def req(rid: str, tokens: tuple[int, ...], cuts=()) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=2), must_cut_at=cuts)


def run_all(s: Scheduler, max_rounds: int = 1000):
    """Rounds until no work is left, every sampled token 5 (the model plays no part here)."""
    done, plans = {}, []
    for _ in range(max_rounds):
        if not s.has_work:
            return None, done, plans
        plan = s.schedule()
        plans.append(plan)
        done.update((e.req_id, e) for e in plan.finished)
        if not plan.is_empty:
            done.update((e.req_id, e) for e in s.update(RoundResult({r: 5 for r in plan.sampled_ids()})))
        s.pool.integrity_check()
    raise AssertionError("requests left after max_rounds")


def sched(**kw) -> Scheduler:
    return Scheduler(config(num_pages=32, max_model_len=1024, **kw), host_slots=4)


def test_the_second_prompt_captures_where_it_diverged_and_the_third_resumes_there():
    s = sched()
    s.add(req("a", prompt(200, 50, 1)))
    _, done, _ = run_all(s)
    assert (done["a"].cached_tokens, done["a"].shortfall) == (0, "unseen")
    s.add(req("b", prompt(200, 50, 2)))
    _, done, plans = run_all(s)
    assert done["b"].cached_tokens == 0 and done["b"].shortfall == "no_mark"
    (chunk,) = [c for p in plans for c in p.prefills if c.req_id == "b"]  # one traversal, keeping at 192
    assert (chunk.start, chunk.end, [point for point, _ in chunk.keeps]) == (0, 250, [192])
    (entry,) = [e for e in s.store.entries() if e.kind == "learned_point"]
    assert entry.num_tokens == 192
    s.add(req("c", prompt(200, 50, 3)))
    _, done, _ = run_all(s)
    assert (done["c"].cached_tokens, done["c"].reuse_kind, done["c"].shortfall) == (192, "learned_point", "none")
    s.store.release_all()
    assert_drained(s)


def test_nothing_is_learned_or_cut_with_reuse_off():
    s = Scheduler(config(num_pages=32, max_model_len=1024))  # no slots: reuse off
    for tag in (1, 2):
        s.add(req(f"r{tag}", prompt(200, 50, tag)))
        _, done, plans = run_all(s)
        assert done[f"r{tag}"].shortfall == "none"
        assert [c.end for p in plans for c in p.prefills if not c.is_last] == []
    assert s.learned is None


def test_learned_points_can_be_turned_off_alone():
    s = Scheduler(config(num_pages=32, max_model_len=1024), host_slots=4, learned_points=False)
    for tag in (1, 2, 3):
        s.add(req(f"r{tag}", prompt(200, 50, tag)))
        _, done, plans = run_all(s)
        assert (done[f"r{tag}"].cached_tokens, done[f"r{tag}"].shortfall) == (0, "none")
        assert [c.end for p in plans for c in p.prefills if not c.is_last] == []
    s.store.release_all()
    assert_drained(s)


def test_an_evicted_capture_is_named():
    s = sched()
    a = req("a", prompt(200, 50, 1), cuts=(192,))
    a.part_end = 192
    s.add(a)
    run_all(s)
    assert [(e.num_tokens, e.kind) for e in s.store.entries()] == [(192, "part_boundary")]
    s.store.release_all()  # e.g. an idle unload
    s.add(req("b", prompt(200, 50, 2)))
    _, done, _ = run_all(s)
    assert (done["b"].cached_tokens, done["b"].shortfall) == (0, "evicted")
    s.store.release_all()
    assert_drained(s)


def test_a_capture_its_request_never_reached_is_named_aborted():
    """The planner of a capture aborted mid-prefill: the next sharer says ``aborted``, not ``not_ready``."""
    s = sched(max_prefill_tokens_per_round=64)
    a = req("a", prompt(200, 50, 1), cuts=(192,))
    a.part_end = 192
    s.add(a)
    plan = s.schedule()
    s.update(RoundResult({r: 5 for r in plan.sampled_ids()}))
    assert a.num_computed_tokens == 64
    s.abort("a")
    s.add(req("b", prompt(200, 50, 2)))
    _, done, _ = run_all(s)
    assert done["a"].reason == "abort"
    assert (done["b"].cached_tokens, done["b"].shortfall) == (0, "aborted")
    s.store.release_all()
    assert_drained(s)


def test_a_learned_point_inside_an_image_is_recorded_where_it_moved():
    """The index keeps the point the request plans (before the image), so the next sharer's reason is
    about that point, and it resumes there."""
    from ignis.engine.reuse.image_keys import ImageKey

    def with_image(tag):
        r = req(f"r{tag}", prompt(200, 50, tag))
        r.place_images((ImageKey(62, 206, b"picture"),), PT)
        return r

    s = sched()
    for tag in (1, 2):
        s.add(with_image(tag))
        run_all(s)
    (entry,) = [e for e in s.store.entries() if e.kind == "learned_point"]
    assert entry.num_tokens == 62  # 192, the page where they part, is inside the picture
    s.add(with_image(3))
    _, done, _ = run_all(s)
    assert (done["r3"].cached_tokens, done["r3"].shortfall) == (62, "none")
    s.store.release_all()
    assert_drained(s)


# ----- what the operator sees ----------------------------------------------------------------------


class Sent:
    def __init__(self):
        self.messages = []

    def send(self, msg, peer):
        self.messages.append((msg, peer))


def test_the_done_line_and_the_metric_carry_the_reason(caplog):
    import logging

    from ignis.engine.metrics import EngineMetrics
    from ignis.engine.schedule import FinishEvent
    from ignis.engine.token_streams import TokenStreams
    from ignis.shared.wire import Generate

    metrics = EngineMetrics("m")
    streams = TokenStreams(Sent(), metrics)
    for rid, reason in (("a", "no_mark"), ("b", "none"), ("c", "no_mark"), ("d", "evicted")):
        streams.track(b"gw", Generate(id=rid, prompt_ids=(1, 2, 3), sampling=SamplingParams()))
        with caplog.at_level(logging.INFO, logger="ignis.engine"):
            streams.finish(FinishEvent(rid, "length", 3, 1, shortfall=reason), "m")
    done = [r.getMessage() for r in caplog.records if '"event":"done"' in r.getMessage()]
    assert ['"shortfall":"no_mark"' in d for d in done] == [True, False, True, False]
    assert '"shortfall":"none"' in done[1]
    scrape = metrics.render().decode()
    assert 'ignis:reuse_shortfall_total{model_name="m",reason="no_mark"} 2.0' in scrape
    assert 'ignis:reuse_shortfall_total{model_name="m",reason="evicted"} 1.0' in scrape
    assert 'reason="none"' not in scrape
