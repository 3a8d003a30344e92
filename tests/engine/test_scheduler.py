"""The scheduler on the CPU, with hand-built round results and a checking fake runner.

``FakeRunner`` plays the model: it keeps each lane's token history from the
plans, checks that every chunk and decode continues exactly where the lane
stopped and that page tables cover every position and are never shared
between live lanes, and "samples" a token that is a pure function of the
history (so a preempted request that recomputes must produce the same tokens).
"""

from __future__ import annotations

import random

import pytest

from ignis.engine.request import Request, RequestState, capture_cuts
from ignis.engine.schedule import DecodeItem, FinishEvent, LaneStart, PrefillChunk, RoundResult
from ignis.engine.scheduler import Refusal, Scheduler, SchedulerConfig
from ignis.shared.sampling import SamplingParams
from ignis.shared.wire import Generate

EOS = 0


def config(**kw) -> SchedulerConfig:
    base = dict(decode_lanes=2, num_pages=8, max_prefill_tokens_per_round=256, max_queue=16,
                max_model_len=512, eos_token_ids=(EOS,))
    return SchedulerConfig(**{**base, **kw})


def request(req_id: str, n: int, cls: str = "interactive", max_tokens: int = 4, cuts=(), first: int = 1, **sampling):
    prompt = tuple(range(first, first + n))
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **sampling), request_class=cls,
                   must_cut_at=cuts)


def next_token(history: list[int]) -> int:
    """A deterministic 'model': never EOS (0), depends on every token so far."""
    h = 0
    for t in history:
        h = (h * 31 + t + 7) % 997
    return h + 1


class FakeRunner:
    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.history: dict[int, list[int]] = {}  # lane -> tokens fed so far
        self.owner: dict[int, str] = {}  # lane -> req id

    def _lane(self, lane: int, req_id: str, position: int) -> list[int]:
        """The lane's history; a runner that joins mid-stream starts from the scheduler's view."""
        if lane not in self.history:
            self.history[lane] = list(self.sched.get(req_id).token_slice(0, position))
            self.owner[lane] = req_id
        assert self.owner[lane] == req_id, f"lane {lane} used by {req_id} but held by {self.owner[lane]}"
        return self.history[lane]

    def run(self, plan) -> RoundResult:
        for p in plan.preempted:
            self.history.pop(p.lane, None)
            self.owner.pop(p.lane, None)
        for s in plan.started:
            self.history[s.lane] = []
            self.owner[s.lane] = s.req_id
        lanes = [d.lane for d in plan.decodes] + [c.lane for c in plan.prefills]
        assert len(lanes) == len(set(lanes)), "a lane appears twice in one round"
        pages_in_use: dict[int, str] = {}
        tokens = {}
        for d in plan.decodes:
            h = self._lane(d.lane, d.req_id, d.position)
            assert d.position == len(h) and len(d.pages) * 64 >= d.position + 1
            h.append(d.token_id)
            tokens[d.req_id] = next_token(h)
            for p in d.pages:
                assert pages_in_use.setdefault(p, d.req_id) == d.req_id, f"page {p} shared by two lanes"
        for c in plan.prefills:
            h = self._lane(c.lane, c.req_id, c.start)
            assert c.start == len(h) and len(c.token_ids) == c.end - c.start > 0
            assert len(c.pages) * 64 >= c.end
            h.extend(c.token_ids)
            if c.is_last:
                tokens[c.req_id] = next_token(h)
            for p in c.pages:
                assert pages_in_use.setdefault(p, c.req_id) == c.req_id, f"page {p} shared by two lanes"
        assert plan.num_prefill_tokens <= self.sched.config.max_prefill_tokens_per_round
        return RoundResult(tokens)


def run_all(sched: Scheduler, max_rounds: int = 10_000) -> tuple[dict[str, list[int]], dict[str, FinishEvent], list]:
    """Drive rounds until no work is left; returns streamed tokens, finish events and the plans."""
    runner = FakeRunner(sched)
    streamed: dict[str, list[int]] = {}
    finished: dict[str, FinishEvent] = {}
    plans = []
    for _ in range(max_rounds):
        if not sched.has_work:
            break
        plan = sched.schedule()
        plans.append(plan)
        for e in plan.finished:
            finished[e.req_id] = e
        if plan.is_empty:
            continue
        result = runner.run(plan)
        for rid, tok in result.tokens.items():
            streamed.setdefault(rid, []).append(tok)
        for e in sched.update(result):
            finished[e.req_id] = e
        sched.pool.integrity_check()
    assert not sched.has_work, "requests left after max_rounds"
    return streamed, finished, plans


def assert_drained(sched: Scheduler) -> None:
    assert sched.pool.num_free == sched.config.num_pages
    assert sched.num_running == 0 and sched.num_waiting == 0
    sched.pool.integrity_check()


# ----- exact lanes, pages and chunks -----------------------------------------------


def test_single_request_exact_plan():
    s = Scheduler(config())
    assert s.add(request("a", 100, max_tokens=3)) is None
    plan = s.schedule()
    assert plan.started == [LaneStart("a", 0, s.get("a").sampling, tuple(range(1, 101)), ())]
    assert plan.prefills == [PrefillChunk("a", 0, 0, 100, True, tuple(range(1, 101)), (0, 1))]
    assert plan.decodes == [] and plan.sampled_ids() == ["a"]
    assert s.pool.refcount(0) == s.pool.refcount(1) == 1 and s.pool.num_free == 6
    assert s.update(RoundResult({"a": 42})) == []
    assert s.get("a").state is RequestState.DECODING and s.get("a").output_ids == [42]
    plan = s.schedule()
    assert plan.decodes == [DecodeItem("a", 0, 100, 42, (0, 1))] and plan.prefills == []
    assert s.update(RoundResult({"a": 43})) == []
    plan = s.schedule()
    assert plan.decodes == [DecodeItem("a", 0, 101, 43, (0, 1))]
    assert s.update(RoundResult({"a": 44})) == [FinishEvent("a", "length", 100, 3)]
    assert s.get("a") is None
    assert_drained(s)


def test_a_scored_prompt_takes_its_rows_cost_from_the_round_budget():
    # each scored row also runs the LM head: charged as one token, a 2,048-row chunk of them held every lane
    # for many rounds' time
    s = Scheduler(config(scored_row_cost=10, num_pages=16))
    s.add(request("scored", 300, prompt_logprobs=0))
    s.add(request("plain", 100, first=1000))
    plan = s.schedule()
    assert [(c.req_id, c.end - c.start) for c in plan.prefills] == [("scored", 25), ("plain", 6)]
    s.update(RoundResult({}))
    plan = s.schedule()
    assert [(c.req_id, c.end - c.start) for c in plan.prefills] == [("scored", 25), ("plain", 6)]
    plain = Scheduler(config(scored_row_cost=10, num_pages=16))
    plain.add(request("a", 300))
    assert [(c.req_id, c.end - c.start) for c in plain.schedule().prefills] == [("a", 256)]


def test_the_scored_row_cost_is_the_heads_share_of_a_rows_work():
    from ignis.engine.scheduler_config import scored_row_cost

    assert scored_row_cost(248320, 5120, 27_000_000_000, tied=False) == 1  # the 27B: its head is 5% of a token
    assert scored_row_cost(248320, 64, 16_558_512, tied=True) == 25  # the demo model: its head is most of it
    with pytest.raises(ValueError, match="scored_row_cost"):
        config(scored_row_cost=0)


def test_pages_grow_one_at_a_time_during_decode():
    s = Scheduler(config())
    s.add(request("a", 127, max_tokens=70))
    plan = s.schedule()
    assert plan.prefills[0].pages == (0, 1)  # 127 prompt tokens + the first decode = 128 positions
    s.update(RoundResult({"a": 5}))
    assert s.schedule().decodes[0].pages == (0, 1)  # position 127
    s.update(RoundResult({"a": 5}))
    d = s.schedule().decodes[0]
    assert (d.position, d.pages) == (128, (0, 1, 2)) and s.pool.num_free == 5
    s.update(RoundResult({"a": 5}))
    run_all(s)
    assert_drained(s)


def test_two_requests_get_lanes_and_pages_in_order():
    s = Scheduler(config())
    s.add(request("a", 64))
    s.add(request("b", 10))
    plan = s.schedule()
    assert [(c.req_id, c.lane, c.pages) for c in plan.prefills] == [("a", 0, (0, 1)), ("b", 1, (2,))]
    s.update(RoundResult({"a": 9, "b": 9}))
    s.abort("a")
    plan = s.schedule()  # "a" leaves at the boundary; lane 0 and pages 0, 1 are free again
    assert plan.finished == [FinishEvent("a", "abort", 64, 1)]
    assert [d.req_id for d in plan.decodes] == ["b"] and s.pool.num_free == 7
    s.add(request("c", 70))
    s.update(RoundResult({"b": 9}))
    plan = s.schedule()
    assert [(c.req_id, c.lane, c.pages) for c in plan.prefills] == [("c", 0, (0, 1))]  # lowest lane and ids
    s.update(RoundResult({"b": 9, "c": 9}))
    run_all(s)
    assert_drained(s)


def test_lowest_free_lane_first():
    s = Scheduler(config(decode_lanes=3, num_pages=16))
    for rid in "abc":
        s.add(request(rid, 8, max_tokens=1 if rid == "a" else 5))
    plan = s.schedule()
    assert [c.lane for c in plan.prefills] == [0, 1, 2]
    assert s.update(RoundResult({r: 3 for r in "abc"})) == [FinishEvent("a", "length", 8, 1)]
    s.add(request("d", 8))
    plan = s.schedule()
    assert plan.started[0].lane == 0 and plan.started[0].req_id == "d"
    s.update(RoundResult({r: 3 for r in plan.sampled_ids()}))
    run_all(s)
    assert_drained(s)


# ----- admission order ---------------------------------------------------------------


def test_interactive_before_agent_and_fifo_within_class():
    s = Scheduler(config(decode_lanes=1, num_pages=16))
    for rid, cls in [("a1", "agent"), ("i1", "interactive"), ("a2", "agent"), ("i2", "interactive")]:
        s.add(request(rid, 10, cls, max_tokens=1))
    order = []
    while s.has_work:
        plan = s.schedule()
        order += [st.req_id for st in plan.started]
        s.update(RoundResult({r: 3 for r in plan.sampled_ids()}))
    assert order == ["i1", "i2", "a1", "a2"]
    assert_drained(s)


def test_head_of_line_is_not_overtaken():
    s = Scheduler(config(decode_lanes=3, num_pages=8, max_prefill_tokens_per_round=1024))
    s.add(request("big0", 300, max_tokens=1))  # 5 pages
    s.add(request("big1", 300, max_tokens=1))  # 5 pages: does not fit beside big0
    s.add(request("small", 10, max_tokens=1))  # would fit, but must wait its turn
    plan = s.schedule()
    assert [st.req_id for st in plan.started] == ["big0"]
    s.update(RoundResult({r: 3 for r in plan.sampled_ids()}))
    plan = s.schedule()
    assert [st.req_id for st in plan.started] == ["big1", "small"]
    s.update(RoundResult({r: 3 for r in plan.sampled_ids()}))
    assert_drained(s)


# ----- prefill chunks ---------------------------------------------------------------------


def test_chunk_budget_is_shared_and_never_exceeded():
    s = Scheduler(config(max_prefill_tokens_per_round=64, num_pages=16))
    s.add(request("a", 100, max_tokens=2))
    s.add(request("b", 50, max_tokens=2))
    chunks = []
    _, done, plans = run_all(s)
    for plan in plans:
        assert plan.num_prefill_tokens <= 64
        chunks.append([(c.req_id, c.start, c.end, c.is_last) for c in plan.prefills])
    assert chunks[:3] == [
        [("a", 0, 64, False)],
        [("a", 64, 100, True), ("b", 0, 28, False)],
        [("b", 28, 50, True)],
    ]
    assert {e.reason for e in done.values()} == {"length"}
    assert_drained(s)


@pytest.mark.parametrize("budget, expected", [
    (256, [(0, 64), (64, 130), (130, 200)]),
    (50, [(0, 50), (50, 64), (64, 114), (114, 130), (130, 180), (180, 200)]),
])
def test_without_inside_captures_cut_points_are_never_crossed(budget, expected):
    s = Scheduler(config(max_prefill_tokens_per_round=budget, capture_inside_chunks=False))
    s.add(request("a", 200, cuts=(64, 130), max_tokens=1))
    _, _, plans = run_all(s)
    spans = [(c.start, c.end) for p in plans for c in p.prefills]
    assert spans == expected
    assert [c.is_last for p in plans for c in p.prefills][-1]
    assert_drained(s)


@pytest.mark.parametrize("budget, expected", [(256, [(0, 200)]), (50, [(0, 50), (50, 100), (100, 150), (150, 200)])])
def test_with_inside_captures_chunks_follow_the_budget_alone(budget, expected):
    s = Scheduler(config(max_prefill_tokens_per_round=budget))
    s.add(request("a", 200, cuts=(64, 130), max_tokens=1))
    _, _, plans = run_all(s)
    assert [(c.start, c.end) for p in plans for c in p.prefills] == expected
    assert_drained(s)


def test_capture_cuts_from_generate_marks():
    assert capture_cuts(300, 150, 290, 64) == (128, 290)
    assert capture_cuts(300, 40, None, 64) == ()  # under a page: no retained prefix
    assert capture_cuts(300, None, 300, 64) == ()  # leaves nothing to prefill after it
    msg = Generate(id="g", prompt_ids=tuple(range(1, 301)), sampling=SamplingParams(), system_end=150,
                   opener_start=290, request_class="agent")
    req = Request.from_generate(msg, 64)
    assert req.must_cut_at == (128, 290) and req.request_class == "agent" and req.system_end == 150


# ----- capacity -----------------------------------------------------------------------------


def test_small_pool_queues_requests_and_all_complete():
    s = Scheduler(config(decode_lanes=4, num_pages=6, max_model_len=384))
    expected = {}
    for i in range(10):
        n = 40 + 37 * i % 200
        s.add(request(f"r{i}", n, "agent" if i % 3 else "interactive", max_tokens=20, first=i + 1))
        expected[f"r{i}"] = n
    streamed, done, plans = run_all(s)
    assert set(done) == set(expected)
    for rid, e in done.items():
        assert e.reason == "length" and e.completion_tokens == 20 and e.prompt_tokens == expected[rid]
        assert len(streamed[rid]) == 20
    assert max(len(p.decodes) + len(p.prefills) for p in plans) <= 4
    assert_drained(s)


def test_preemption_recomputes_and_resumes_with_the_same_tokens():
    # Reference: plenty of pages, no preemption.
    big = Scheduler(config(num_pages=64))
    reqs = [("i", 120, "interactive"), ("a", 120, "agent")]
    for rid, n, cls in reqs:
        big.add(request(rid, n, cls, max_tokens=60, first=3 if cls == "agent" else 1))
    reference, _, plans = run_all(big)
    assert not any(p.preempted for p in plans)

    # 5 pages: both prompts fit (2 pages each), but both cannot grow to 180 tokens (3 pages each).
    s = Scheduler(config(num_pages=5, max_model_len=320))
    for rid, n, cls in reqs:
        s.add(request(rid, n, cls, max_tokens=60, first=3 if cls == "agent" else 1))
    streamed, done, plans = run_all(s)
    preempted = [(p.req_id, p.lane) for plan in plans for p in plan.preempted]
    assert preempted and all(rid == "a" for rid, _ in preempted)  # the agent is lower-ranked
    assert done["a"].completion_tokens == 60 and done["i"].completion_tokens == 60
    assert streamed == reference  # the resumed agent produced exactly the same tokens
    # The resume prefilled prompt + output so far, and said what was already generated.
    resume = next(st for plan in plans for st in plan.started if st.req_id == "a" and st.generated)
    assert resume.prompt_ids == tuple(range(3, 123)) and list(resume.generated) == reference["a"][:len(resume.generated)]
    assert_drained(s)


def test_preempted_request_goes_to_the_front_of_its_queue():
    s = Scheduler(config(decode_lanes=2, num_pages=4, max_model_len=256))
    s.add(request("a0", 120, "agent", max_tokens=100))
    s.add(request("a1", 60, "agent", max_tokens=100))
    runner = FakeRunner(s)
    plan = s.schedule()
    s.update(runner.run(plan))
    s.add(request("a2", 10, "agent", max_tokens=1))
    while True:
        plan = s.schedule()
        if plan.preempted:
            break
        s.update(runner.run(plan))
    assert [p.req_id for p in plan.preempted] == ["a1"]
    assert s.get("a1").state is RequestState.WAITING and s.get("a1").num_preemptions == 1
    assert [r.req_id for r in s.waiting["agent"]] == ["a1", "a2"]  # ahead of the later arrival
    assert plan.started == []  # nothing is admitted in a round that preempted
    s.update(runner.run(plan))
    s.abort("a0")
    s.abort("a1")
    s.abort("a2")
    s.schedule()
    assert_drained(s)


# ----- refusals ------------------------------------------------------------------------------


def test_refusals():
    s = Scheduler(config(max_queue=2, max_model_len=256))
    r = s.add(request("long", 256))
    assert isinstance(r, Refusal) and r.reason == "too_long" and "max_model_len 256" in r.message
    assert s.add(request("ok", 255)) is None
    dup = s.add(request("ok", 3))
    assert dup.reason == "bad_request" and "already in use" in dup.message
    assert s.add(request("q2", 3)) is None
    full = s.add(request("q3", 3))
    assert full.reason == "queue_full" and "max_queue 2" in full.message
    assert s.get("long") is None and s.get("q3") is None and s.num_waiting == 2
    with pytest.raises(ValueError, match="already added"):
        s.add(s.get("ok"))
    run_all(s)
    assert_drained(s)


@pytest.mark.parametrize("kw, match", [
    ({"decode_lanes": 0}, "--decode-lanes"),
    ({"max_queue": -1}, "--max-queue"),
    ({"max_prefill_tokens_per_round": 1.5}, "--max-prefill-tokens-per-round"),
    ({"max_model_len": 8 * 64 + 1}, "exceeds the KV pool"),
    ({"eos_token_ids": (-1,)}, "eos_token_ids"),
])
def test_config_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        config(**kw)


def test_bad_requests_raise():
    with pytest.raises(ValueError, match="empty"):
        Request("x", (), SamplingParams())
    with pytest.raises(ValueError, match="cut points"):
        Request("x", (1, 2), SamplingParams(), must_cut_at=(3,))
    with pytest.raises(ValueError, match="request_class"):
        Request("x", (1, 2), SamplingParams(), request_class="batch")


# ----- aborts ----------------------------------------------------------------------------------


def test_abort_queued_is_immediate():
    s = Scheduler(config(decode_lanes=1))
    s.add(request("a", 10, max_tokens=50))
    s.add(request("b", 10))
    plan = s.schedule()
    assert s.abort("b") == FinishEvent("b", "abort", 10, 0)
    assert s.get("b") is None and s.num_waiting == 0
    assert s.abort("b") is None and s.abort("never") is None
    s.update(RoundResult({"a": 5}))
    assert s.abort("a") is None  # running: freed at the next boundary
    plan = s.schedule()
    assert plan.finished == [FinishEvent("a", "abort", 10, 1)] and plan.is_empty
    assert_drained(s)


def test_abort_while_round_in_flight_drops_its_token():
    s = Scheduler(config())
    s.add(request("a", 10, max_tokens=50))
    s.add(request("b", 10, max_tokens=50))
    s.schedule()
    s.update(RoundResult({"a": 5, "b": 5}))
    s.schedule()  # decodes of a and b in flight
    assert s.abort("a", "error", "runner failed") is None
    pages_before = s.pool.num_free
    assert s.update(RoundResult({"a": 6, "b": 6})) == []
    assert s.get("a").output_ids == [5] and s.pool.num_free == pages_before  # not freed mid-round
    plan = s.schedule()
    assert plan.finished == [FinishEvent("a", "error", 10, 1, "runner failed")]
    assert [d.req_id for d in plan.decodes] == ["b"]
    s.update(RoundResult({"b": 7}))
    s.abort("b")
    s.schedule()
    assert_drained(s)


def test_a_stop_the_gateway_matched_counts_the_tokens_its_output_kept():
    """The gateway matched a stop string in the first of three tokens sent; two more were sampled before its
    Abort arrived: the request ends as a stop of one completion token (usage, done line, histogram)."""
    s = Scheduler(config())
    s.add(request("a", 10, max_tokens=50))
    s.schedule()
    for token in (5, 6, 7):
        s.update(RoundResult({"a": token}))
        s.schedule()
    assert s.abort("a", "stop", kept_tokens=1) is None
    assert s.update(RoundResult({"a": 8})) == []
    assert s.schedule().finished == [FinishEvent("a", "stop", 10, 1)]
    s.add(request("b", 10))
    assert s.abort("b", "stop", kept_tokens=4) == FinishEvent("b", "stop", 10, 0)  # never more than it has
    assert_drained(s)


def test_abort_everything_returns_the_pool_to_full():
    s = Scheduler(config(decode_lanes=3, num_pages=6, max_model_len=384))
    for i in range(6):
        s.add(request(f"r{i}", 90, max_tokens=100))
    runner = FakeRunner(s)
    for _ in range(5):
        s.update(runner.run(s.schedule()))
    assert s.pool.num_free < 6
    events = [s.abort(f"r{i}") for i in range(6)]
    waiting = {e.req_id for e in events if e is not None}
    running = {r.req_id for r in s.running()}
    assert waiting and running and waiting | running == {f"r{i}" for i in range(6)}
    plan = s.schedule()
    assert {e.req_id for e in plan.finished} == running and plan.is_empty
    assert not s.has_work
    assert_drained(s)


# ----- finishing -------------------------------------------------------------------------------


def test_stop_tokens_eos_and_ignore_eos():
    s = Scheduler(config(decode_lanes=3))
    s.add(request("eos", 5, max_tokens=10))
    s.add(request("ign", 5, max_tokens=2, ignore_eos=True))
    s.add(request("stop", 5, max_tokens=10, stop_token_ids=(77,)))
    s.schedule()
    assert s.update(RoundResult({"eos": EOS, "ign": EOS, "stop": 5})) == [FinishEvent("eos", "stop", 5, 1)]
    s.schedule()
    assert s.update(RoundResult({"ign": EOS, "stop": 77})) == [
        FinishEvent("ign", "length", 5, 2), FinishEvent("stop", "stop", 5, 2)]
    assert_drained(s)


def test_max_model_len_ends_with_length():
    s = Scheduler(config(max_model_len=70))
    s.add(request("a", 66, max_tokens=100))
    streamed, done, _ = run_all(s)
    assert done["a"] == FinishEvent("a", "length", 66, 4) and len(streamed["a"]) == 4
    assert_drained(s)


# ----- protocol errors ---------------------------------------------------------------------------


def test_round_protocol_is_enforced():
    s = Scheduler(config())
    with pytest.raises(RuntimeError, match="no round in flight"):
        s.update(RoundResult())
    assert s.schedule().is_empty  # an empty plan needs no update
    s.add(request("a", 10))
    s.schedule()
    with pytest.raises(RuntimeError, match="in flight"):
        s.schedule()
    with pytest.raises(ValueError, match=r"missing \['a'\]"):
        s.update(RoundResult({}))
    with pytest.raises(ValueError, match=r"unexpected \['z'\]"):
        s.update(RoundResult({"a": 1, "z": 1}))
    with pytest.raises(ValueError, match="not a token id"):
        s.update(RoundResult({"a": -1}))
    assert s.get("a").output_ids == []  # a rejected result changes nothing
    s.update(RoundResult({"a": 1}))
    run_all(s)
    assert_drained(s)


def test_stats():
    s = Scheduler(config(decode_lanes=1))
    s.add(request("a", 100))
    s.add(request("b", 10))
    s.schedule()
    stats = s.stats()
    assert {k: stats[k] for k in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc",
                                  "num_preemptions_total")} == {
        "num_requests_waiting": 1, "num_requests_running": 1, "kv_cache_usage_perc": 2 / 8,
        "num_preemptions_total": 0}
    assert stats["retained_entries"] == 0
    s.update(RoundResult({"a": 1}))
    run_all(s)
    assert_drained(s)


# ----- random workloads ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_random_workloads_complete_and_match_a_roomy_run(seed):
    rng = random.Random(seed)
    num_pages = rng.randint(4, 12)
    cfg = dict(decode_lanes=rng.randint(1, 5), num_pages=num_pages, max_model_len=num_pages * 64,
               max_prefill_tokens_per_round=rng.choice([16, 64, 200, 1000]), max_queue=100)
    specs = []
    for i in range(rng.randint(1, 12)):
        n = rng.randint(1, num_pages * 24)
        cuts = tuple(sorted(rng.sample(range(1, n + 1), min(n, rng.randint(0, 3)))))
        specs.append((f"r{i}", n, rng.choice(["interactive", "agent"]), rng.randint(1, 150), cuts, i + 1))

    def make(spec):
        rid, n, cls, max_tokens, cuts, first = spec
        return request(rid, n, cls, max_tokens=max_tokens, cuts=cuts, first=first)

    roomy = Scheduler(config(**{**cfg, "num_pages": 256, "decode_lanes": 16}))
    for spec in specs:
        roomy.add(make(spec))
    reference, _, _ = run_all(roomy)

    s = Scheduler(config(**cfg))
    runner = FakeRunner(s)
    todo = list(specs)
    streamed: dict[str, list[int]] = {}
    done: dict[str, FinishEvent] = {}
    aborted = set()
    for _ in range(20_000):
        while todo and rng.random() < 0.3:
            assert s.add(make(todo.pop(0))) is None
        if rng.random() < 0.02 and s.has_work:
            rid = rng.choice(sorted(r for r in reference if s.get(r) is not None) or [None])
            if rid is not None:
                aborted.add(rid)
                event = s.abort(rid)
                if event is not None:
                    done[rid] = event
        if not s.has_work and not todo:
            break
        plan = s.schedule()
        done.update((e.req_id, e) for e in plan.finished)
        if not plan.is_empty:
            result = runner.run(plan)
            for rid, tok in result.tokens.items():
                streamed.setdefault(rid, []).append(tok)
            done.update((e.req_id, e) for e in s.update(result))
        s.pool.integrity_check()
    assert set(done) == {spec[0] for spec in specs}
    for rid, event in done.items():
        got = streamed.get(rid, [])[:event.completion_tokens]
        if rid in aborted:
            assert event.reason == "abort" and got == reference[rid][:len(got)]
        else:
            assert event.reason == "length" and got == reference[rid]
    assert_drained(s)
