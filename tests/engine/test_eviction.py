"""Live eviction in one process: agents evicted window by window for interactive requests, then resumed.

The lower tier is a fake that keeps clones of the pages and the staged image,
so what is checked is the engine's side: windows, staging, resume, and that
every agent produces exactly the tokens of an undisturbed run.
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
from ignis.engine.tier_ops import TierOp
from ignis.engine.tier_port import NO_TIERS, NullTierPort
from ignis.engine.tiers.restore_check import finite_image, finite_pages
from ignis.shared.sampling import SamplingParams


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


class FakeTier(NullTierPort):
    """A lower tier for live sequences only: clones of page windows and staged images, by request."""

    def __init__(self, state: ModelState, staging: int, refuse_after: int | None = None):
        self.state, self.staging = state, staging
        self.pages: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.images: dict[str, tuple] = {}
        self.windows = 0
        self.refuse_after = refuse_after

    def _slot(self):
        return self.state._slot(self.staging)

    def demote_window(self, req_id, index, pages, request_class):
        if self.refuse_after is not None and self.windows >= self.refuse_after:
            return False
        self.windows += 1
        self.pages[(req_id, index)] = [self.state.pages[:, :, p].clone() for p in pages]
        return True

    def demote_image(self, req_id, lane, request_class):
        self.state.save_image(lane, self.staging)
        block, i = self._slot()
        blocks = (self.state.slot_ssm, self.state.slot_conv) + ((self.state.slot_window,) if self.state.slot_window
                                                                 else ())
        self.images[req_id] = tuple(b[block][:, i].clone() for b in blocks)
        return True

    def restore_window(self, req_id, index, pages):
        saved = self.pages[(req_id, index)]
        assert len(pages) == len(saved)
        for p, t in zip(pages, saved):
            self.state.pages[:, :, p].copy_(t)
        return True

    def restore_image(self, req_id):
        block, i = self._slot()
        blocks = (self.state.slot_ssm, self.state.slot_conv) + ((self.state.slot_window,) if self.state.slot_window
                                                                 else ())
        for b, saved in zip(blocks, self.images[req_id]):
            b[block][:, i].copy_(saved)
        return True

    def drop_window(self, req_id, index):
        self.pages.pop((req_id, index), None)

    def drop_image(self, req_id):
        self.images.pop(req_id, None)

    def check_restored(self, pages, num_tokens, slot):  # the engine's own check (the state is NaN-filled)
        return finite_pages(self.state, pages, num_tokens) and finite_image(self.state, slot, num_tokens)


class SlowRestores(FakeTier):
    """Restores land ``latency`` polls after they are posted (the next one by default), as tierd's replies
    do (the others land at once); a drop posted after a restore takes effect after it, as tierd reads its
    messages in order."""

    latency = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.due: list[list] = []  # [op, copy, polls to go]

    def restore_window(self, req_id, index, pages):
        saved = self.pages[(req_id, index)]
        return self._later(lambda: FakeTier.restore_window(self, req_id, index, pages), {(req_id, index): saved})

    def restore_image(self, req_id):
        return self._later(lambda: FakeTier.restore_image(self, req_id), None, {req_id: self.images[req_id]})

    def _later(self, copy, pages=None, images=None) -> TierOp:
        op = TierOp("restore")

        def copy_posted():  # the bytes as they were when the restore was posted
            kept_pages, kept_images = dict(self.pages), dict(self.images)
            self.pages.update(pages or {})
            self.images.update(images or {})
            try:
                copy()
            finally:
                self.pages, self.images = kept_pages, kept_images

        self.due.append([op, copy_posted, self.latency])
        return op

    hold = False  # True: nothing lands

    @property
    def in_flight(self) -> int:
        return len(self.due)

    def poll(self, wait_s=0.0):
        if self.hold:
            return 0
        for item in self.due:
            item[2] -= 1
        landed = [item for item in self.due if item[2] <= 0]
        self.due = [item for item in self.due if item[2] > 0]
        for op, copy, _ in landed:
            copy()
            op.finish(True)
        return len(landed)


class Harness:
    def __init__(self, model, lanes=4, pages=64, evict=True, window=1, refuse_after=None, kv_format="bf16",
                 tier=FakeTier):
        host_slots = 4
        self.state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32,
                                         fill=float("nan"), kv_format=kv_format,
                                         exact_window=64 if kv_format == "hq-e8-2b" else 0)
        self.state.allocate_slots(0, host_slots + 1)
        staging = host_slots  # the last host slot stages images
        self.tier = tier(self.state, staging, refuse_after) if evict else None
        self.sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                               capture_inside_chunks=kv_format == "bf16"),
                               host_slots=host_slots, tiers=self.tier or NO_TIERS, evict_window_pages=window,
                               staging_slot=staging if evict else None)
        self.runner = ModelRunner(model, self.state, vocab_limit=TOKENIZER_SIZE)
        self.tokens: dict[str, list[int]] = {}
        self.finished = {}  # req_id -> FinishEvent
        self.rounds = 0

    def submit(self, rid, prompt, cls, **sampling):
        sp = SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **sampling})
        assert self.sched.add(Request(rid, tuple(prompt), sp, request_class=cls)) is None

    def step(self):
        plan = self.sched.schedule()
        if plan.is_empty:
            if plan.started:
                self.runner.run(plan)
            return
        result, _ = self.runner.run(plan)
        for rid, tok in result.tokens.items():
            self.tokens.setdefault(rid, []).append(tok)
        for ev in self.sched.update(result):
            self.finished[ev.req_id] = ev
            self.runner.release(ev.req_id)
        self.rounds += 1

    def run(self, limit=5000):
        for _ in range(limit):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("did not drain")


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(TOKENIZER_SIZE) for _ in range(n)]


def _nothing_held(h):
    """No copy left below, and every page back in the pool once retained entries are released."""
    assert not h.tier.pages and not h.tier.images
    h.sched.store.release_all()
    assert h.sched.pool.num_free == h.sched.pool.num_pages
    h.sched.pool.integrity_check()


AGENT_SAMPLING = [dict(max_tokens=30), dict(max_tokens=30, temperature=0.9, top_p=0.9, seed=11),
                  dict(max_tokens=30), dict(max_tokens=30, temperature=1.0, seed=5, repetition_penalty=1.2)]


def undisturbed(model, i, kv_format="bf16"):
    h = Harness(model, evict=False, kv_format=kv_format)
    h.submit(f"agent{i}", prompt(150 + 10 * i, i), "agent", **AGENT_SAMPLING[i])
    h.run()
    return h.tokens[f"agent{i}"]


@pytest.mark.parametrize("kv_format", ["bf16", "hq-e8-2b"])
def test_agents_evicted_window_by_window_resume_bit_exact(model, kv_format):
    h = Harness(model, window=1, kv_format=kv_format)
    for i in range(4):
        h.submit(f"agent{i}", prompt(150 + 10 * i, i), "agent", **AGENT_SAMPLING[i])
    for _ in range(8):  # all four decoding
        h.step()
    for j in range(2):
        h.submit(f"user{j}", prompt(60, 100 + j), "interactive", max_tokens=5)
    saw_evicting = False
    for _ in range(5000):
        if not h.sched.has_work:
            break
        saw_evicting |= h.sched.stats()["live_evicting"] > 0
        h.step()
    stats = h.sched.stats()
    assert saw_evicting
    assert stats["live_evictions_total"] >= 2 and stats["live_resumes_total"] == stats["live_evictions_total"]
    assert h.tier.windows >= 2 * 3  # three pages each, one window per round
    # each finish says how often its request was evicted and resumed (the done line's "preempted")
    assert sum(ev.live_resumes for ev in h.finished.values()) == stats["live_resumes_total"]
    assert sum(ev.live_evictions for ev in h.finished.values()) == stats["live_evictions_total"]
    assert all(ev.recomputed == 0 for ev in h.finished.values())
    for i in range(4):
        assert h.tokens[f"agent{i}"] == undisturbed(model, i, kv_format), i
    assert len(h.tokens["user0"]) == 5 and len(h.tokens["user1"]) == 5
    assert not h.tier.pages and not h.tier.images  # dropped after resume
    h.sched.store.release_all()
    assert h.sched.pool.num_free == h.sched.pool.num_pages
    h.sched.pool.integrity_check()


def test_refused_demote_abandons_the_eviction_and_the_agent_decodes_on(model):
    h = Harness(model, lanes=1, window=1, refuse_after=1)
    h.submit("agent0", prompt(150, 0), "agent", **AGENT_SAMPLING[0])
    for _ in range(5):
        h.step()
    h.submit("user", prompt(40, 9), "interactive", max_tokens=3)
    h.run()
    assert h.sched.stats()["live_evictions_abandoned_total"] >= 1
    assert h.tokens["agent0"] == undisturbed(model, 0)
    assert len(h.tokens["user"]) == 3
    h.sched.pool.integrity_check()


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_refused_eviction_without_kv_disk_preempts_for_the_waiting_head(model, on_disk):
    """The tier refuses the agent: with no KV-disk behind it the agent gives up its lane to recompute,
    so the interactive request is served now; with KV-disk on nothing is pushed out and it waits."""
    h = Harness(model, lanes=1, window=1, refuse_after=0)
    h.tier.live_on_disk = on_disk
    h.submit("agent0", prompt(150, 0), "agent", **AGENT_SAMPLING[0])
    for _ in range(5):
        h.step()
    h.submit("user", prompt(40, 9), "interactive", max_tokens=3)
    user_done_at = agent_tokens_then = None
    for _ in range(500):
        if not h.sched.has_work:
            break
        h.step()
        if user_done_at is None and "user" in h.finished:
            user_done_at, agent_tokens_then = h.rounds, len(h.tokens["agent0"])
    stats = h.sched.stats()
    assert stats["live_evictions_abandoned_total"] >= 1
    assert h.tokens["agent0"] == undisturbed(model, 0) and len(h.tokens["user"]) == 3
    if on_disk:
        assert stats["num_preemptions_total"] == 0 and agent_tokens_then == 30  # it waited for the agent
    else:
        assert stats["num_preemptions_total"] == 1 and agent_tokens_then < 30
        assert h.finished["agent0"].recomputed == 1
    h.sched.pool.integrity_check()


def test_decode_pressure_evicts_a_live_sequence_instead_of_recomputing_it(model):
    """Four agents whose growth outruns the pool: a decode short of a page moves the lowest-ranked
    sequence down a tier (a window a round) and waits; nothing is preempted, every output is bit-exact."""
    h = Harness(model, pages=9, window=1)  # three agents fill it; two of them grow into a fourth page
    for i in range(4):
        h.submit(f"agent{i}", prompt(150 + 10 * i, i), "agent", **AGENT_SAMPLING[i])
    h.run()
    stats = h.sched.stats()
    assert stats["live_evictions_total"] >= 1 and stats["live_resumes_total"] == stats["live_evictions_total"]
    assert stats["num_preemptions_total"] == 0
    for i in range(4):
        assert h.tokens[f"agent{i}"] == undisturbed(model, i), i
    _nothing_held(h)


def test_decode_pressure_without_a_tier_preempts_as_before(model):
    h = Harness(model, pages=9, evict=False)
    for i in range(4):
        h.submit(f"agent{i}", prompt(150 + 10 * i, i), "agent", **AGENT_SAMPLING[i])
    h.run()
    assert h.sched.stats()["num_preemptions_total"] >= 1
    assert sum(ev.recomputed for ev in h.finished.values()) == h.sched.stats()["num_preemptions_total"]
    for i in range(4):
        assert h.tokens[f"agent{i}"] == undisturbed(model, i), i


def test_an_abandoned_eviction_backs_off_before_the_next_one_starts():
    """A waiting request behind a full tier does not ask it again every round: 50 ms, doubling, then clear."""
    from types import SimpleNamespace

    from ignis.engine.eviction import RETRY_AFTER_S, Evictor

    now = [100.0]
    evictor = Evictor(NullTierPort(), window_pages=1, staging_slot=0, clock=lambda: now[0])
    agent = SimpleNamespace(req_id="agent", num_computed_tokens=10)
    assert evictor.may_start()
    waits = []
    for _ in range(8):
        evictor.start(agent)
        evictor.abandon(agent)
        assert not evictor.may_start()
        start = now[0]
        while not evictor.may_start():
            now[0] += 0.01
        waits.append(round(now[0] - start, 2))
    assert waits[0] == RETRY_AFTER_S[0] and waits[1] == 2 * RETRY_AFTER_S[0]
    assert max(waits) == RETRY_AFTER_S[1] and waits == sorted(waits)
    assert evictor.abandoned == 8
    assert not Evictor(NullTierPort(), window_pages=1, staging_slot=None).may_start()  # off without a staging slot


def test_decode_pressure_respects_the_backoff(model):
    """With the clock frozen inside the back-off, a decode short of a page preempts by recompute instead of
    starting another eviction the full tier would refuse."""
    now = [0.0]
    h = Harness(model, lanes=4, pages=10, window=1, refuse_after=0)
    h.sched.evictor.clock = lambda: now[0]
    for i in range(4):
        h.submit(f"agent{i}", prompt(100 + 10 * i, i), "agent", **{**AGENT_SAMPLING[i], "max_tokens": 120})
    h.run()
    assert h.sched.evictor.abandoned == 1
    assert h.sched.stats()["num_preemptions_total"] >= 1
    h.sched.pool.integrity_check()


def test_aborting_a_preempted_request_keeps_the_fate_of_the_captures_it_made(model):
    from ignis.engine.preemption import preempt
    from ignis.engine.request import RequestState

    h = Harness(model, lanes=2, pages=32, evict=False)
    sp = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=50)
    assert h.sched.add(Request("r", tuple(prompt(200, 3)), sp, request_class="agent", must_cut_at=(128,),
                               system_end=130)) is None
    req = h.sched._requests["r"]
    while req.state is not RequestState.DECODING:
        h.step()
    store = h.sched.store
    assert len(store) == 1  # the capture at 128 was taken
    store.release_all()  # then released for room: its fate is "evicted"
    key = req.key_prefix(128)
    assert store.fates.of(key) == "evicted"
    preempt(h.sched, req)  # waits to recompute, nothing computed
    h.sched.abort("r")
    assert store.fates.of(key) == "evicted"


def test_a_head_short_of_pages_with_a_lane_free_is_served_before_the_agent_ends(model):
    """A lane is free but the pages are the agent's: with the tier refusing and no KV-disk, the agent
    gives up its pages to recompute, and the interactive request does not wait for its 40 tokens."""
    h = Harness(model, lanes=2, pages=6, window=1, refuse_after=0)
    h.submit("agent0", prompt(300, 0), "agent", max_tokens=40)  # 5 of 6 pages
    for _ in range(5):
        h.step()
    h.submit("user", prompt(100, 9), "interactive", max_tokens=3)  # needs 2 pages, 1 free
    agent_tokens_then = None
    for _ in range(500):
        if not h.sched.has_work:
            break
        h.step()
        if agent_tokens_then is None and "user" in h.finished:
            agent_tokens_then = len(h.tokens["agent0"])
    assert agent_tokens_then < 40 and len(h.tokens["user"]) == 3
    assert h.finished["agent0"].recomputed >= 1
    undisturbed_agent = Harness(model, evict=False)
    undisturbed_agent.submit("agent0", prompt(300, 0), "agent", max_tokens=40)
    undisturbed_agent.run()
    assert h.tokens["agent0"] == undisturbed_agent.tokens["agent0"]
    h.sched.pool.integrity_check()


def test_no_lane_is_freed_for_a_request_waiting_for_its_lower_tier_match(model):
    """A head waiting for tierd to bring its match back cannot take a lane until then: no eviction or preemption
    acts for it meanwhile (the lane would stand idle, the victim's work be lost for nothing)."""
    from ignis.engine.preemption import waiting_head

    h = Harness(model, lanes=1, window=1, refuse_after=0)
    h.submit("agent0", prompt(150, 0), "agent", **AGENT_SAMPLING[0])
    for _ in range(5):
        h.step()
    h.submit("user", prompt(40, 9), "interactive", max_tokens=3)
    user = h.sched.waiting["interactive"][0]
    user.tier_wait_since = 0.0  # as admission marks a request whose match is being copied back
    assert waiting_head(h.sched) is None
    for _ in range(10):
        h.step()
    stats = h.sched.stats()
    assert stats["live_evictions_total"] + stats["live_evictions_abandoned_total"] + stats["num_preemptions_total"] == 0
    assert user.state.name == "WAITING" and len(h.tokens["agent0"]) == 15
    user.tier_wait_since = None  # its match is back: now the agent makes room (refused below: preempted)
    assert waiting_head(h.sched) is user
    h.run()
    assert len(h.tokens["user"]) == 3 and h.tokens["agent0"] == undisturbed(model, 0)
    assert h.sched.stats()["num_preemptions_total"] == 1
    h.sched.pool.integrity_check()


def _undisturbed_alone(model, rid, prompt_ids, max_tokens):
    h = Harness(model, evict=False)
    h.submit(rid, prompt_ids, "agent", max_tokens=max_tokens)
    h.run()
    return h.tokens[rid]


def _agent_resuming(model, hold=False):
    """agent0 (5 of 8 pages) moved down for user1 (7 pages), user1 done, and agent0's restores posted
    into the pages it reserved (``hold``: they do not land until the test lets them)."""
    h = Harness(model, lanes=4, pages=8, window=1, tier=SlowRestores)
    h.tier.hold = hold
    h.submit("agent0", prompt(300, 0), "agent", max_tokens=40)
    for _ in range(5):
        h.step()
    h.submit("user1", prompt(400, 9), "interactive", max_tokens=3)
    for _ in range(200):
        h.step()
        if "agent0" in h.sched.evictor.resuming:
            break
    assert "user1" in h.finished and "agent0" in h.sched.evictor.resuming
    return h


def test_a_resume_gives_its_room_to_a_higher_class_request_short_of_pages(model):
    """The agent's copies are on their way back into pages it reserved when an interactive request needing
    those pages arrives: the resume is withdrawn (it used to hold them while nothing ran, for ever), the
    interactive request is served, and the agent resumes later from the same copies, bit-exact."""
    h = _agent_resuming(model)
    h.submit("user2", prompt(400, 10), "interactive", max_tokens=3)
    h.run(limit=300)
    stats = h.sched.stats()
    assert stats["live_resumes_withdrawn_total"] == 1
    assert stats["live_evictions_total"] == stats["live_resumes_total"] >= 1
    assert stats["num_preemptions_total"] == 0 and h.finished["agent0"].recomputed == 0
    assert len(h.tokens["user1"]) == 3 and len(h.tokens["user2"]) == 3
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(300, 0), 40)
    assert not h.tier.pages and not h.tier.images  # dropped once it resumed
    h.sched.store.release_all()
    assert h.sched.pool.num_free == h.sched.pool.num_pages
    h.sched.pool.integrity_check()


def test_an_eviction_takes_the_staging_slot_from_a_resume_waiting_for_a_lane(model):
    """Two lanes: agent1 resumes into the staging slot but the last lane goes to an interactive request; a
    second one evicts agent0, whose image needs the slot. The waiting resume is withdrawn (agent0 would
    otherwise hold its lane, not decoding, until agent1 got one), and both agents end bit-exact."""
    h = Harness(model, lanes=2, pages=64, window=1, tier=SlowRestores)
    h.submit("agent0", prompt(150, 0), "agent", max_tokens=30)
    h.submit("agent1", prompt(160, 1), "agent", max_tokens=30)
    for _ in range(6):
        h.step()
    h.submit("user1", prompt(40, 9), "interactive", max_tokens=3)  # no lane: agent1 moves down
    for _ in range(200):
        h.step()
        if "agent1" in h.sched.evictor.resuming:
            break
    assert "user1" in h.finished and h.sched.evictor.staging_user == "agent1"
    h.submit("user2", prompt(40, 10), "interactive", max_tokens=20)  # takes the free lane
    h.submit("user3", prompt(40, 11), "interactive", max_tokens=3)  # finds none: agent0 moves down
    h.run(limit=500)
    stats = h.sched.stats()
    assert stats["live_resumes_withdrawn_total"] >= 1
    assert stats["live_evictions_total"] == stats["live_resumes_total"] >= 2
    assert stats["num_preemptions_total"] == 0
    assert [len(h.tokens[u]) for u in ("user1", "user2", "user3")] == [3, 20, 3]
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(150, 0), 30)
    assert h.tokens["agent1"] == _undisturbed_alone(model, "agent1", prompt(160, 1), 30)
    _nothing_held(h)


def test_a_request_aborted_while_its_withdrawn_restores_land_leaves_nothing_held(model):
    h = _agent_resuming(model, hold=True)
    h.submit("user2", prompt(400, 10), "interactive", max_tokens=3)
    h.step()  # user2 is short of the pages agent0 reserved: the resume is withdrawn, its restores in flight
    assert h.sched.stats()["live_resumes_withdrawn_total"] == 1 and "agent0" not in h.sched.evictor.resuming
    assert h.tier.due and h.sched.copies_in_flight and h.sched.pool.num_free < 7  # the room waits for them
    ended = h.sched.abort("agent0")  # waiting: it ends now, its done line saying it was evicted
    assert (ended.reason, ended.live_evictions, ended.live_resumes, ended.recomputed) == ("abort", 1, 0, 0)
    h.tier.hold = False
    h.run(limit=300)
    assert len(h.tokens["user2"]) == 3
    assert not h.tier.pages and not h.tier.images and h.sched.evictor.staging_user is None
    h.sched.store.release_all()
    assert h.sched.pool.num_free == h.sched.pool.num_pages
    h.sched.pool.integrity_check()


def test_an_evicted_head_short_of_pages_takes_them_from_a_resume_behind_it(model):
    """An evicted interactive request whose copies were lost must recompute and needs pages an agent's
    resume reserved behind it: the resume is withdrawn (it used to keep them while nothing ran)."""
    from ignis.engine.eviction import Evicted

    h = _agent_resuming(model, hold=True)
    h.submit("user2", prompt(400, 10), "interactive", max_tokens=3)
    h.sched.waiting["interactive"][0].evicted = Evicted(computed=0, lost=True)  # its copies below are gone
    h.tier.hold = False
    h.run(limit=300)
    assert h.sched.stats()["live_resumes_withdrawn_total"] == 1
    assert h.tokens["user2"] == _undisturbed_alone(model, "user2", prompt(400, 10), 3)
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(300, 0), 40)
    h.sched.store.release_all()
    assert h.sched.pool.num_free == h.sched.pool.num_pages
    h.sched.pool.integrity_check()


def test_a_sequence_shorter_than_the_exact_window_resumes_from_its_copies(model):
    """hq-e8-2b: an agent of fewer tokens than the exact window (64 here) is moved down and back; the check of
    its restored image reads only the window rows its tokens wrote (it read the whole ring, rows the lane
    never wrote, NaN here: the copies were refused and the agent recomputed)."""
    h = Harness(model, lanes=1, pages=8, window=1, kv_format="hq-e8-2b")
    h.submit("agent0", prompt(39, 0), "agent", max_tokens=30)
    for _ in range(5):
        h.step()
    h.submit("user", prompt(40, 9), "interactive", max_tokens=3)
    h.run()
    stats = h.sched.stats()
    assert stats["live_evictions_total"] == stats["live_resumes_total"] == 1
    assert stats["reuse_restore_rejected_total"] == 0 and h.finished["agent0"].recomputed == 0
    alone = Harness(model, evict=False, kv_format="hq-e8-2b")
    alone.submit("agent0", prompt(39, 0), "agent", max_tokens=30)
    alone.run()
    assert h.tokens["agent0"] == alone.tokens["agent0"]
    _nothing_held(h)


def test_a_decode_short_of_a_page_takes_it_from_a_lower_ranked_resume_not_from_itself(model):
    """An interactive request admitted beside an agent's resume (its restores landing five rounds later, into
    room it reserved) grows past the free pages: the resume is withdrawn and the decode waits for that room
    (it used to move the interactive request itself down a tier, the only one decoding, while the agent's
    reservation for a sequence not running stayed). Both end as undisturbed."""
    class FiveRoundRestores(SlowRestores):
        latency = 5

    h = Harness(model, lanes=4, pages=8, window=1, tier=FiveRoundRestores)
    h.submit("agent0", prompt(300, 0), "agent", max_tokens=40)
    for _ in range(5):
        h.step()
    h.submit("user1", prompt(400, 9), "interactive", max_tokens=3)  # 7 pages: agent0 moves down
    for _ in range(200):
        h.step()
        if "agent0" in h.sched.evictor.resuming:
            break
    assert "user1" in h.finished and h.sched.pool.num_free == 3
    h.submit("user2", prompt(190, 10), "interactive", max_tokens=20)  # the 3 free pages, a 4th after 2 tokens
    h.run(limit=500)
    user2, agent0 = h.finished["user2"], h.finished["agent0"]
    assert (user2.live_evictions, user2.recomputed) == (0, 0)
    assert list(h.finished).index("user2") < list(h.finished).index("agent0")
    assert h.sched.stats()["live_resumes_withdrawn_total"] == 1 and agent0.recomputed == 0
    assert h.tokens["user2"] == _undisturbed_alone(model, "user2", prompt(190, 10), 20)
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(300, 0), 40)
    _nothing_held(h)


def test_an_evicted_head_short_of_room_moves_a_lower_class_sequence_down(model):
    """An evicted interactive request (its copies lost: it recomputes) needs more pages than are free while an
    agent decodes: it asks for room as any head does, and the agent moves down a tier for it (it used to
    wait for the agent to end). Both end as undisturbed."""
    from ignis.engine.eviction import Evicted

    h = Harness(model, lanes=4, pages=8, window=1)
    h.submit("agent0", prompt(300, 0), "agent", max_tokens=40)  # 5 pages
    for _ in range(5):
        h.step()
    h.submit("user2", prompt(250, 10), "interactive", max_tokens=3)  # 4 pages, 3 free
    h.sched.waiting["interactive"][0].evicted = Evicted(computed=0, lost=True)
    h.run(limit=500)
    assert list(h.finished).index("user2") < list(h.finished).index("agent0")
    assert h.finished["agent0"].live_evictions == 1 and h.finished["agent0"].recomputed == 0
    assert h.tokens["user2"] == _undisturbed_alone(model, "user2", prompt(250, 10), 3)
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(300, 0), 40)
    _nothing_held(h)


def test_a_request_preempted_to_the_front_of_a_resumes_queue_takes_its_room(model):
    """The tier refuses a second live sequence, so a decode short of a page preempts agent1 to recompute; it
    goes to the front of the agent queue, ahead of agent0 whose restores (landing two rounds later) hold the
    pages agent1 needs. agent0's resume is withdrawn (nothing ran, for ever, before), and both agents end as
    undisturbed."""
    class TwoRoundRestores(SlowRestores):
        latency = 2

    h = Harness(model, lanes=4, pages=8, window=1, tier=TwoRoundRestores, refuse_after=5)
    h.submit("agent1", prompt(180, 1), "agent", max_tokens=120)
    h.submit("agent0", prompt(300, 0), "agent", max_tokens=40)
    for _ in range(4):
        h.step()
    h.submit("user1", prompt(400, 9), "interactive", max_tokens=3)
    h.run(limit=1500)
    stats = h.sched.stats()
    assert stats["live_resumes_withdrawn_total"] >= 1 and stats["num_preemptions_total"] >= 1
    assert len(h.tokens["user1"]) == 3
    assert h.tokens["agent0"] == _undisturbed_alone(model, "agent0", prompt(300, 0), 40)
    assert h.tokens["agent1"] == _undisturbed_alone(model, "agent1", prompt(180, 1), 120)
    _nothing_held(h)


def test_an_evicting_request_aborted_as_its_window_lands_leaves_no_copy_below(model):
    """The window's demote lands in a poll (the idle one of an empty round, or the one that starts a round)
    and the request's abort is applied before the window is counted: the copy was never dropped (tierd
    keeps live copies for ever)."""
    class SlowDemotes(FakeTier):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.due = []

        def demote_window(self, req_id, index, pages, request_class):
            op = TierOp("demote")
            self.due.append((op, lambda: FakeTier.demote_window(self, req_id, index, pages, request_class)))
            return op

        @property
        def in_flight(self):
            return len(self.due)

        def poll(self, wait_s=0.0):
            due, self.due = self.due, []
            for op, copy in due:
                copy()
                op.finish(True)
            return len(due)

    h = Harness(model, lanes=1, pages=64, window=1, tier=SlowDemotes)
    h.submit("agent0", prompt(150, 0), "agent", max_tokens=30)
    for _ in range(5):
        h.step()
    h.submit("user", prompt(40, 9), "interactive", max_tokens=3)  # no lane: agent0 starts moving down
    while "agent0" not in h.sched.evictor.evicting:
        h.step()
    h.step()  # its first window is posted, and lands in the round's idle poll: not yet counted
    record = h.sched.evictor.evicting["agent0"]
    assert record.op is not None and record.op.ok and not record.windows
    h.sched.abort("agent0")  # its client goes away
    h.run(limit=200)
    assert len(h.tokens["user"]) == 3
    _nothing_held(h)
