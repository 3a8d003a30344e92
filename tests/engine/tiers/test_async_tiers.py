"""Engine-tierd exchanges off the critical path: posted, polled, and never in the way of a decode.

In one process: scheduler + runner on tiny random checkpoints of both
families, the pool and host slots in shared memory, a real tierd behind
them. Nothing here asserts a duration on its own: the slow-disk case counts
the tokens the other lane produces while a demote is held up by an injected
3 s disk delay, and compares its largest gap between tokens with that delay.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time

import pytest
import torch

from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request, RequestState, capture_cuts
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.engine.tiers.wiring import connect_tiers
from ignis.shared.sampling import SamplingParams
from ignis.tierd.disk import FAULT_DISK_WRITE_ENV
from tests.tierd.fake_engine import TierdProcess

PAGE = 64
VOCAB = 128
TOL = 1e-5
DELAY_S = 3.0
_stamps = itertools.count()


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, VOCAB) for _ in range(n)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class Rig:
    """Scheduler + runner stepped one round at a time; ``endpoint`` None: no lower tiers, reuse off."""

    def __init__(self, model, family: str, endpoint: str | None, pages: int = 16, lanes: int = 2,
                 host_slots: int = 4, timeout_s: float = 10.0, tier_wait_limit_s: float = 2.0):
        tiers = endpoint is not None
        self.state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32,
                                         fill=float("nan"), shared=tiers)
        self.state.allocate_slots(0, host_slots)
        self.port = None
        kw = {}
        if tiers:
            self.port = connect_tiers(self.state, endpoint, f"async-{family}-{next(_stamps)}", family,
                                      device_slots=0, staging_slot=None, timeout_s=timeout_s)
            assert self.port is not None and self.port.client.welcome is not None
            kw = dict(tiers=self.port, restore_floors={"ram": 64, "disk": 64})
        self.sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * PAGE,
                                               max_prefill_tokens_per_round=4096,
                                               tier_wait_limit_s=tier_wait_limit_s), host_slots=host_slots,
                               reuse=tiers, **kw)
        self.runner = ModelRunner(model, self.state)
        self.rounds = 0
        self.tokens: dict[str, list[int]] = {}
        self.token_round: dict[str, list[int]] = {}
        self.token_time: dict[str, list[float]] = {}
        self.first_logits: dict[str, torch.Tensor] = {}
        self.started: dict[str, int] = {}
        self.finished = {}

    @property
    def client(self):
        return self.port.client

    def submit(self, rid, p, max_tokens=6, system_end=None, opener_start=None):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        req = Request(rid, tuple(p), sp, system_end=system_end, opener_start=opener_start, last_is_user=True,
                      must_cut_at=capture_cuts(len(p), system_end, opener_start, PAGE))
        assert self.sched.add(req) is None

    def step(self):
        self.rounds += 1
        plan = self.sched.schedule()
        for s in plan.started:
            self.started.setdefault(s.req_id, self.rounds)
        for ev in plan.finished:
            self.finished[ev.req_id] = ev
        if plan.is_empty:
            if plan.started or plan.copies_before:
                self.runner.run(plan)
            return
        result, _ = self.runner.run(plan)
        now = time.monotonic()
        for rid, row in self.runner.last_logits.items():
            self.first_logits.setdefault(rid, row.clone())
        for rid, tok in result.tokens.items():
            self.tokens.setdefault(rid, []).append(tok)
            self.token_round.setdefault(rid, []).append(self.rounds)
            self.token_time.setdefault(rid, []).append(now)
        for ev in self.sched.update(result):
            self.finished[ev.req_id] = ev
            self.runner.release(ev.req_id)

    def run(self, limit: int = 20_000):
        for _ in range(limit):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("did not drain")

    def check_drained(self):
        assert not self.sched.has_work
        self.sched.store.release_all()
        assert self.sched.pool.num_free == self.sched.pool.num_pages
        assert self.sched.store.slots.num_free == self.sched.store.slots.total
        self.sched.pool.integrity_check()

    def close(self):
        if self.port is not None:
            self.port.client.close()
        self.state.close()


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def family_model(request, checkpoint_factory):
    model, _ = load_model(checkpoint_factory(request.param).path)
    return request.param, model


def cold(model, family, p, max_tokens=6):
    rig = Rig(model, family, None)
    try:
        rig.submit("cold", p, max_tokens=max_tokens)
        rig.run()
        return rig.tokens["cold"], rig.first_logits["cold"]
    finally:
        rig.close()


# ----- the client's rules, without a tierd -----------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_timed_out_demote_frees_its_memory_and_a_timed_out_restore_is_quarantined(tmp_path):
    from ignis.engine.tiers.client import TierClient
    from ignis.shared.tier_layout import UnitLayout

    from ignis.shared.tier_layout import BlockDesc

    clock = FakeClock()
    blocks = [BlockDesc("kv", "shm", "ignis-nobody-kv", 2, 4, 4096, 4 * 4096),
              BlockDesc("a", "shm", "ignis-nobody-a", 1, 2, 4096, 2 * 4096)]
    client = TierClient(f"ipc://{tmp_path}/nobody.sock", "s", "qwen3_5", 4096, blocks, UnitLayout("kv", ("a",), None),
                        timeout_s=2.0, backoff_s=5.0, quarantine_s=60.0, clock=clock)
    try:
        client.welcome = object()  # as if a hello had been answered; nobody answers from here on
        demote = client.demote("a1" * 8, [("kv", 0)], "retained", "agent", 0.0)
        restore = client.restore("b2" * 8, [("kv", 1)])
        assert demote.pending and restore.pending and client.in_flight == 2
        client.poll()
        assert demote.pending  # no reply yet, and no waiting for one
        clock.now += 2.5
        client.poll()
        assert not demote.pending and not demote.ok and demote.memory_free  # tierd only read those pages
        assert not restore.pending and not restore.ok and not restore.memory_free  # it may still write these
        assert client.welcome is None and client.quarantined == 1
        assert not client.ready  # backing off: lower tiers off meanwhile
        assert not client.demote("c3" * 8, [("kv", 2)], "retained", "agent", 0.0).ok  # refused at once, a miss
        clock.now += 61
        client.poll()
        assert restore.memory_free and client.quarantined == 0
        assert client.in_flight == 1  # past the back-off an idle poll says hello again (nobody answers here)
    finally:
        client.close()


def fake_tierd_socket(tmp_path):
    """(endpoint, ROUTER bound at it): where a test's scripted tierd answers the client."""
    import zmq

    endpoint = f"ipc://{tmp_path}/fake-tierd.sock"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    return endpoint, router


def test_an_idle_engine_checks_tierd_and_notices_one_that_is_gone(tmp_path):
    from ignis.engine.tiers.client import TierClient
    from ignis.shared.tier_layout import BlockDesc, UnitLayout

    clock = FakeClock()
    blocks = [BlockDesc("kv", "shm", "ignis-nobody-kv", 2, 4, 4096, 4 * 4096)]
    client = TierClient(f"ipc://{tmp_path}/nobody.sock", "s", "qwen3_5", 4096, blocks, UnitLayout("kv", (), None),
                        timeout_s=2.0, backoff_s=5.0, keepalive_s=5.0, clock=clock)
    try:
        client.welcome = object()  # welcomed once; the tierd that did so is gone, nobody answers
        client.poll()
        assert client.in_flight == 0  # traffic-free and within the keep-alive: nothing posted
        clock.now += 5
        client.poll()
        assert client.in_flight == 0 and client._keepalive is not None and client.welcome is not None
        clock.now += 2.5
        client.poll()
        assert client.welcome is None  # unanswered: tierd is marked down (ignis:tierd_connected 0)
    finally:
        client.close()


def test_a_restarted_tierd_is_told_hello_without_traffic(tmp_path):
    import threading

    from ignis.engine.tiers.client import TierClient
    from ignis.shared.tier_layout import BlockDesc, UnitLayout
    from ignis.shared.tier_wire import ENGINE_TIERD, TIER_PROTOCOL_VERSION, Hello, Lookup, TierRefused, Welcome

    endpoint, router = fake_tierd_socket(tmp_path)
    seen = []

    def fake_tierd():  # a tierd that restarted: it refuses the keep-alive, then welcomes the new hello
        for _ in range(2):
            frames = router.recv_multipart()
            peer, msg = frames[0], ENGINE_TIERD.decode(frames[1:])
            seen.append(type(msg).__name__)
            if isinstance(msg, Lookup):
                reply = TierRefused(msg.req, "lookup", "", "not_ready", "no engine has said hello")
            else:
                assert isinstance(msg, Hello)
                reply = Welcome(msg.req, TIER_PROTOCOL_VERSION, 1 << 20, 4, 4096, 0, 0)
            router.send_multipart([peer] + ENGINE_TIERD.encode(reply))

    clock = FakeClock()
    blocks = [BlockDesc("kv", "shm", "ignis-nobody-kv", 2, 4, 4096, 4 * 4096)]
    client = TierClient(endpoint, "s", "qwen3_5", 4096, blocks, UnitLayout("kv", (), None), timeout_s=10.0,
                        keepalive_s=5.0, clock=clock)
    thread = threading.Thread(target=fake_tierd, daemon=True)
    thread.start()
    try:
        client.welcome = object()  # welcomed by the tierd before the restart
        clock.now += 5
        client.poll()  # posts the keep-alive
        deadline = time.monotonic() + 10
        while client.connects == 0 and time.monotonic() < deadline:
            client.poll(wait_s=0.1)
        assert seen == ["Lookup", "Hello"] and client.connects == 1 and client.ready
    finally:
        thread.join(10)
        client.close()
        router.close()


# ----- pending restores, both families ----------------------------------------------------


def demoted_conversation(rig: Rig) -> list[int]:
    """A prompt whose checkpoints were retained and then moved down to KV-RAM by unrelated work."""
    p = prompt(300, 11)
    rig.submit("a", p, system_end=200, opener_start=297)
    rig.run()
    for i in range(2):  # unrelated work that needs the room: retained entries move down
        rig.submit(f"fill{i}", prompt(900, 30 + i), max_tokens=2)
        rig.run()
    assert rig.sched.store.demotions >= 1
    return p


def test_a_request_waits_for_its_restore_and_is_admitted_the_round_after_it_lands(tmp_path, family_model):
    family, model = family_model
    tierd = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    rig = Rig(model, family, tierd.endpoint)
    try:
        p = demoted_conversation(rig)
        posted = []
        restore = rig.client.restore
        rig.client.restore = lambda *a: posted.append((rig.rounds, restore(*a))) or posted[-1][1]
        rig.submit("again", p, system_end=200, opener_start=297)
        landed = None  # the round by whose end the Restored reply had been taken
        while "again" not in rig.started:
            rig.step()
            if posted and landed is None and not posted[0][1].pending:
                landed = rig.rounds
            assert landed is None or rig.rounds <= landed + 1, "the bytes landed, the request was not admitted"
        (post_round, op), = posted
        assert op.ok and rig.started["again"] > post_round  # posted in one round, admitted in a later one
        assert rig.started["again"] in (landed, landed + 1)  # the round the reply was taken in, or the next
        rig.run()
        ev = rig.finished["again"]
        assert (ev.cached_tokens, ev.reuse_tier) == (297, "kv_ram")
        tokens, logits = cold(model, family, p)
        assert rig.tokens["again"] == tokens
        assert rel(rig.first_logits["again"], logits) < TOL
        rig.check_drained()
    finally:
        rig.close()
        assert tierd.stop() == 0


def test_a_frozen_tierd_holds_the_queue_once_for_the_bound_then_nobody_waits_for_it(tmp_path, family_model):
    """tierd frozen while a request waits at the head for its KV-RAM match: after ``tier_wait_limit_s`` it
    computes from its device match (shortfall tier_failed, counted), and the requests after it do not wait
    for tierd at all until it answers again; once it does, matches come back from KV-RAM again. Every output
    equals a cold run's."""
    family, model = family_model
    tierd = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    rig = Rig(model, family, tierd.endpoint, tier_wait_limit_s=0.3)
    try:
        p = demoted_conversation(rig)
        os.kill(tierd.proc.pid, signal.SIGSTOP)  # tierd answers nothing from here on
        rig.submit("again", p, system_end=200, opener_start=297)
        rig.submit("bystander", prompt(100, 12), max_tokens=3)
        rig.submit("same", p, system_end=200, opener_start=297)  # its match is below too: it does not wait
        deadline = time.monotonic() + 5  # not --tierd-timeout (10 s) per request
        while not {"again", "bystander", "same"} <= set(rig.finished):
            assert time.monotonic() < deadline, "the requests waited for the frozen tierd"
            rig.step()
        again, same = rig.finished["again"], rig.finished["same"]
        assert again.tier_wait_s >= 0.3 and again.shortfall == "tier_failed" and again.cached_tokens < 297
        assert same.tier_wait_s == 0 and rig.finished["bystander"].tier_wait_s == 0
        assert rig.sched.stats()["reuse_tier_give_ups_total"] == 1
        os.kill(tierd.proc.pid, signal.SIGCONT)
        rig.submit("later", p, system_end=200, opener_start=297)
        rig.run()
        for rid, q, n in (("again", p, 6), ("same", p, 6), ("later", p, 6), ("bystander", prompt(100, 12), 3)):
            tokens, logits = cold(model, family, q, max_tokens=n)
            assert rig.tokens[rid] == tokens and rel(rig.first_logits[rid], logits) < TOL, rid
        rig.check_drained()
    finally:
        os.kill(tierd.proc.pid, signal.SIGCONT)
        rig.close()
        assert tierd.stop() == 0


# ----- a slow disk: the other lane decodes on ----------------------------------------------


def slow_disk_scenario(model, family, endpoint, timeout_s=10.0, kill=None):
    """A retained entry is demoted to KV-disk (the arena is off) while another lane decodes; returns the
    rig, the prompt, the other lane's tokens produced while a demote was in flight, and the rounds
    whose held pages were checked."""
    rig = Rig(model, family, endpoint, timeout_s=timeout_s)
    p = prompt(300, 5)
    rig.submit("a", p, system_end=200, opener_start=297)
    rig.run()
    rig.submit("other", prompt(64, 6), max_tokens=300)
    while len(rig.tokens.get("other", ())) < 2:
        rig.step()
    rig.submit("fill", prompt(600, 7), max_tokens=2)  # needs the retained entries' room
    during, checked = 0, 0
    while rig.sched.has_work:
        before = len(rig.tokens.get("other", ()))
        rig.step()
        moves = rig.sched.store.moves
        if moves.demoting:
            during += len(rig.tokens.get("other", ())) - before
            held = {p for d in moves.demoting for p in d.hold.pages}
            for req in rig.sched.running():  # no page a demote in flight reads is in anyone's table
                assert not held & set(req.page_table.pages), (held, req.req_id)
            assert all(rig.sched.pool.refcount(p) >= 1 for p in held)
            checked += 1
            if kill is not None:
                kill()
                kill = None
    return rig, p, during, checked


def max_gap(times: list[float]) -> float:
    return max(b - a for a, b in zip(times, times[1:]))


def test_a_slow_disk_does_not_stop_the_other_lanes(tmp_path, checkpoint_factory):
    model, _ = load_model(checkpoint_factory("qwen3_5").path)
    gaps = {}
    for delay in (0.0, DELAY_S):
        rt = tmp_path / f"rt{delay}"
        rt.mkdir()
        tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "0", "--kv-disk-bytes", "64M",
                             env={FAULT_DISK_WRITE_ENV: str(delay)})
        rig = None
        try:
            rig, p, during, checked = slow_disk_scenario(model, "qwen3_5", tierd.endpoint)
            gaps[delay] = max_gap(rig.token_time["other"])
            assert rig.sched.store.demotions >= 1, "nothing went down to KV-disk"
            assert len(rig.tokens["other"]) == 300 and len(rig.tokens["fill"]) == 2
            if delay:
                print(f"other lane: {during} tokens while a demote waited on the slow disk; largest gap between "
                      f"tokens {gaps[delay]:.3f} s with a {delay:.0f} s disk delay, {gaps[0.0]:.3f} s without")
                assert checked >= 1 and during >= 20  # a blocking demote would let none through
                assert gaps[delay] < delay
            other_tokens, _ = cold(model, "qwen3_5", prompt(64, 6), max_tokens=300)
            assert rig.tokens["other"] == other_tokens
            # the held pages were not written while tierd read them: the entry comes back exact
            rig.submit("again", p, system_end=200, opener_start=297)
            rig.run()
            ev = rig.finished["again"]
            assert (ev.cached_tokens, ev.reuse_tier) == (297, "kv_disk")
            tokens, logits = cold(model, "qwen3_5", p)
            assert rig.tokens["again"] == tokens and rel(rig.first_logits["again"], logits) < TOL
            rig.check_drained()
        finally:
            if rig is not None:
                rig.close()
            assert tierd.stop() == 0


def test_tierd_killed_mid_demote_the_pages_come_back_and_the_engine_serves_on(tmp_path, checkpoint_factory, caplog):
    """The demote's copy waits on a 30 s disk when tierd is killed: past the client's deadline the demote
    fails, tierd is marked down, and its pages go back to the pool (tierd only read them, and a new
    hello drops whatever it kept); every request completes with a cold run's tokens."""
    model, _ = load_model(checkpoint_factory("qwen3_5").path)
    tierd = TierdProcess(tmp_path, "--reuse-kv-host-pool-bytes", "0", "--kv-disk-bytes", "64M",
                         env={FAULT_DISK_WRITE_ENV: "30"})

    def kill():
        tierd.proc.kill()
        tierd.proc.wait()

    rig = None
    try:
        rig, p, during, checked = slow_disk_scenario(model, "qwen3_5", tierd.endpoint, timeout_s=2.0, kill=kill)
        assert checked >= 1 and tierd.proc.poll() is not None
        assert rig.sched.store.demotions == 0 and rig.client.welcome is None
        assert "tierd did not answer Demote" in caplog.text
        other_tokens, _ = cold(model, "qwen3_5", prompt(64, 6), max_tokens=300)
        assert rig.tokens["other"] == other_tokens and len(rig.tokens["fill"]) == 2
        rig.submit("again", p, system_end=200, opener_start=297)
        rig.run()
        assert rig.finished["again"].reuse_tier not in ("kv_ram", "kv_disk")
        assert rig.tokens["again"] == cold(model, "qwen3_5", p)[0]
        rig.check_drained()
    finally:
        if rig is not None:
            rig.close()
        tierd.stop()


def test_garbage_from_tierd_is_counted_dropped_and_the_real_reply_still_lands(tmp_path):
    import threading

    from ignis.engine.tiers.client import TierClient
    from ignis.shared.tier_layout import BlockDesc, UnitLayout
    from ignis.shared.tier_wire import ENGINE_TIERD, TIER_PROTOCOL_VERSION, Hello, Welcome

    endpoint, router = fake_tierd_socket(tmp_path)

    def fake_tierd():  # answers the hello with three kinds of garbage first, then a welcome
        frames = router.recv_multipart()
        peer, hello = frames[0], ENGINE_TIERD.decode(frames[1:])
        assert isinstance(hello, Hello)
        for junk in ([b"not a message"], [b'{"type": "tier_welcome", "v": 1}'], [b'{"type": "nope", "v": 1}']):
            router.send_multipart([peer] + junk)
        router.send_multipart([peer] + ENGINE_TIERD.encode(
            Welcome(hello.req, TIER_PROTOCOL_VERSION, 1 << 20, 4, 4096, 0, 0)))

    blocks = [BlockDesc("kv", "shm", "ignis-nobody-kv", 2, 4, 4096, 4 * 4096)]
    client = TierClient(endpoint, "s", "qwen3_5", 4096, blocks, UnitLayout("kv", (), None), timeout_s=10.0)
    thread = threading.Thread(target=fake_tierd, daemon=True)
    thread.start()
    try:
        assert client.connect() and client.ready
        assert client.channel.garbage_count == 3  # the engine's wire_errors_total{socket="tierd"}
    finally:
        thread.join(10)
        client.close()
        router.close()
