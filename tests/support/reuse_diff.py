"""Differential reuse checks: a reuse-on engine driven by a list of operations, against reuse-off references.

An operation list is plain tuples (what hypothesis prints on a failure is a
replay that ``run_ops`` takes as it is)::

    ("new", sys, user, seed, cls, max_tokens)   a conversation's first turn: system block ``sys`` + a user text
    ("turn", conv, user, seed, after_user)      the next turn of conversation ``conv`` (history + its answer)
    ("retry", k)                                the k-th submitted prompt again (a retry, a regenerate)
    ("fork", k, extra, seed)                    the k-th prompt up to its opener + another ending
    ("burst", sys, n, seed)                     n agent requests sharing system block ``sys``
    ("long", seed)                              an unrelated prompt of nearly the whole pool
    ("urgent", sys, user, seed)                 once an agent decodes (at most 60 rounds), an interactive request
    ("squeeze", seed)                           two prompts of half the pool each, ending a token short of a page
    ("abort", k)                                abort the k-th submitted request (if still live)
    ("step", n)                                 run n rounds

Indices are taken modulo what exists, so any list is a valid run (hypothesis
shrinks freely). Every finished, non-aborted request is compared with a
reuse-off engine running its prompt alone: the greedy tokens must be equal,
and each token's logprob within ``LOGPROB_TOL``; at a near-tie of the cold run
(the token reuse picked rated within ``NEAR_TIE`` of the cold pick) the two may
part, and the comparison stops there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from ignis.engine.models.state import ModelState
from ignis.engine.request import Request, RequestState, capture_cuts
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.engine.tier_port import NO_TIERS
from ignis.engine.tiers.wiring import connect_tiers
from ignis.shared.sampling import SamplingParams

LOGPROB_TOL = 1e-4
"""Absolute, on each generated token's fp32 log probability (a resumed prefill sums in another order)."""
NEAR_TIE = 1e-4
"""Cold logprob gap under which the reuse run may pick the other token of a near-tie."""
MAX_TOKENS = 40
"""The longest completion asked for: long ones grow their page tables while decoding (page pressure, preemption)."""
OPENER = (5, 6, 7)
SYSTEM_LENGTHS = (70, 140, 200)
VOCAB = 128
PAGE = 64


@dataclass(frozen=True)
class Config:
    lanes: int = 2
    pages: int = 12
    device_slots: int = 0
    host_slots: int = 2
    budget: int = 4096
    window: int = 1
    tiers: bool = True


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, VOCAB) for _ in range(n)]


def system_block(i: int) -> list[int]:
    return tokens(SYSTEM_LENGTHS[i % len(SYSTEM_LENGTHS)], 1000 + i % len(SYSTEM_LENGTHS))


@dataclass
class Sent:
    rid: str
    prompt: tuple[int, ...]
    system_end: int | None
    opener_start: int
    cls: str
    max_tokens: int
    conv: int | None
    req: Request
    logprobs: list = field(default_factory=list)
    end: str | None = None
    salt: str | None = None  # the request's cache salt: what it may reuse is only its salt's


class Driver:
    """Scheduler + runner (+ a tierd session) stepped one round at a time, tokens and logprobs kept per request."""

    def __init__(self, model, family: str, cfg: Config, reuse: bool = True, endpoint: str | None = None,
                 stamp: str = "diff"):
        self.cfg = cfg
        tiers = endpoint is not None and cfg.tiers
        self.state = ModelState.allocate(model.cfg, num_pages=cfg.pages, lanes=cfg.lanes, dtype=torch.float32,
                                         fill=float("nan"), shared=tiers)
        staging = cfg.device_slots + cfg.host_slots if tiers else None
        self.state.allocate_slots(cfg.device_slots, cfg.host_slots + (1 if tiers else 0))
        port = NO_TIERS
        self.client = None
        if tiers:
            port = connect_tiers(self.state, endpoint, stamp, family, device_slots=cfg.device_slots,
                                 staging_slot=staging)
            assert port is not None and port.client.welcome is not None
            self.client = port.client
        self.sched = Scheduler(SchedulerConfig(decode_lanes=cfg.lanes, num_pages=cfg.pages,
                                               max_model_len=cfg.pages * PAGE, max_prefill_tokens_per_round=cfg.budget),
                               device_slots=cfg.device_slots, host_slots=cfg.host_slots, reuse=reuse, tiers=port,
                               restore_floors={"ram": 1, "disk": 1}, evict_window_pages=cfg.window,
                               staging_slot=staging)
        self.runner = ModelRunner(model, self.state)
        self.sent: list[Sent] = []
        self.by_id: dict[str, Sent] = {}
        self.refused = 0
        # key tokens of every capture -> the salts of the requests that made one (``check_salts``)
        self.creators: dict[tuple[int, ...], set] = {}
        capture = self.sched.store.capture

        def recording(tokens, live, *args, **kwargs):
            maker = self.by_id.get(live.name)
            self.creators.setdefault(tuple(tokens), set()).add(maker.salt if maker is not None else "?")
            return capture(tokens, live, *args, **kwargs)

        self.sched.store.capture = recording

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.state.close()

    def submit(self, prompt, system_end=None, opener_start=None, cls="interactive", max_tokens=MAX_TOKENS,
               conv=None, last_is_user=True, salt=None) -> Sent | None:
        rid = f"r{len(self.sent)}"
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=True, top_logprobs=2)
        req = Request(rid, tuple(prompt), sp, request_class=cls, system_end=system_end, opener_start=opener_start,
                      last_is_user=last_is_user, cache_salt=salt,
                      must_cut_at=capture_cuts(len(prompt), system_end, opener_start, PAGE))
        if self.sched.add(req) is not None:
            self.refused += 1
            return None
        s = Sent(rid, tuple(prompt), system_end, opener_start, cls, max_tokens, conv, req, salt=salt)
        self.sent.append(s)
        self.by_id[rid] = s
        return s

    def step(self) -> None:
        plan = self.sched.schedule()
        for ev in plan.finished:
            self._ended(ev)
        if plan.is_empty:
            if plan.started or plan.copies_before:
                self.runner.run(plan)
            return
        result, logprobs = self.runner.run(plan)
        for rid in result.tokens:
            s = self.by_id[rid]
            if s.req.pending_end is None:
                s.logprobs.append(logprobs[rid])
        for ev in self.sched.update(result):
            self._ended(ev)
        self.sched.pool.integrity_check()

    def _ended(self, ev) -> None:
        self.runner.release(ev.req_id)
        self.by_id[ev.req_id].end = ev.reason

    def drain(self, limit: int = 20_000) -> None:
        for _ in range(limit):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("the engine did not drain")

    def check_drained(self) -> None:
        """Every request ended, and with retained state dropped every page and slot is free again."""
        assert not self.sched.has_work
        assert all(s.end is not None for s in self.sent), [s.rid for s in self.sent if s.end is None]
        assert not self.sched.evictor.evicting
        self.sched.store.release_all()
        pool = self.sched.pool
        pool.integrity_check()
        assert pool.num_free == pool.num_pages, (pool.num_free, pool.num_pages)
        slots = self.sched.store.slots
        assert slots.num_free == slots.total, (slots.num_free, slots.total)


def _salt(drawn: list) -> str | None:
    """An op's optional last element: the cache salt of the requests it starts (None: unsalted)."""
    return drawn[0] if drawn else None


def run_ops(drv: Driver, ops) -> None:
    """Apply ``ops`` (see the module docstring) to ``drv``, then drain it."""
    convs: list[list[Sent]] = []
    max_len = drv.cfg.pages * PAGE - MAX_TOKENS - 1
    for op in ops:
        kind = op[0]
        if kind == "new":
            _, sys_i, user, seed, cls, max_tokens, *salt = op
            system = system_block(sys_i)
            p = system + tokens(user, seed) + list(OPENER)
            s = drv.submit(p, len(system), len(p) - 3, cls, max_tokens, conv=len(convs), salt=_salt(salt))
            if s is not None:
                convs.append([s])
        elif kind == "turn" and convs:
            _, c, user, seed, after_user = op
            chain = convs[c % len(convs)]
            last = chain[-1]
            if last.end is None:
                continue  # its answer is not there yet
            answer = list(last.req.output_ids) if last.end != "abort" else []
            p = list(last.prompt) + answer + tokens(user, seed) + list(OPENER)
            if len(p) > max_len:
                continue
            s = drv.submit(p, last.system_end, len(p) - 3, last.cls, last.max_tokens, conv=last.conv,
                           last_is_user=after_user, salt=last.salt)
            if s is not None:
                chain.append(s)
        elif kind == "retry" and drv.sent:
            src = drv.sent[op[1] % len(drv.sent)]
            drv.submit(src.prompt, src.system_end, src.opener_start, src.cls, src.max_tokens, salt=src.salt)
        elif kind == "fork" and drv.sent:
            _, k, extra, seed = op
            src = drv.sent[k % len(drv.sent)]
            p = list(src.prompt[:src.opener_start]) + tokens(extra, seed) + list(OPENER)
            if len(p) <= max_len:
                drv.submit(p, src.system_end, len(p) - 3, src.cls, src.max_tokens, salt=src.salt)
        elif kind == "burst":
            _, sys_i, n, seed, *salt = op
            system = system_block(sys_i)
            for j in range(n):
                p = system + tokens(10 + 13 * j, seed * 31 + j) + list(OPENER)
                drv.submit(p, len(system), len(p) - 3, "agent", 16, salt=_salt(salt))
        elif kind == "long":
            p = tokens(max_len - op[1] % 40, 5000 + op[1])
            drv.submit(p, None, len(p) - 3, "agent", 3)
        elif kind == "urgent":
            _, sys_i, user, seed = op
            for _ in range(60):
                if any(r.request_class == "agent" and r.state is RequestState.DECODING for r in drv.sched.running()):
                    break
                if not drv.sched.has_work:
                    break
                drv.step()
            system = system_block(sys_i)
            p = system + tokens(user, seed) + list(OPENER)
            s = drv.submit(p, len(system), len(p) - 3, "interactive", 8, conv=len(convs))
            if s is not None:
                convs.append([s])
        elif kind == "squeeze":  # together they fill the pool: the first decode past the page preempts
            n = drv.cfg.pages // 2 * PAGE - 1
            for j in range(2):
                p = tokens(n, 7000 + 2 * op[1] + j)
                drv.submit(p, None, n - 3, "interactive", 8)
        elif kind == "abort" and drv.sent:
            s = drv.sent[op[1] % len(drv.sent)]
            if s.end is None:
                ev = drv.sched.abort(s.rid)
                if ev is not None:
                    drv._ended(ev)
        elif kind == "step":
            for _ in range(op[1]):
                drv.step()
    drv.drain()


class References:
    """Reuse-off outputs, one run per distinct prompt (alone on its engine), kept across examples."""

    def __init__(self, model, family: str):
        self.model, self.family = model, family
        self._cache: dict[tuple[int, ...], tuple[list[int], list]] = {}
        self.runs = 0

    def get(self, prompt: tuple[int, ...], max_tokens: int) -> tuple[list[int], list]:
        """The cold greedy tokens and logprobs of ``prompt``, at least ``max_tokens`` (or 8) of them."""
        if prompt not in self._cache or len(self._cache[prompt][0]) < max_tokens:
            n = max(max_tokens, 8)
            pages = -(-(len(prompt) + n + 1) // PAGE)
            drv = Driver(self.model, self.family, Config(lanes=1, pages=pages, host_slots=0, tiers=False), reuse=False)
            try:
                s = drv.submit(prompt, max_tokens=n)
                drv.drain()
                assert s.end == "length"
                self._cache[prompt] = (list(s.req.output_ids), s.logprobs)
                self.runs += 1
            finally:
                drv.close()
        return self._cache[prompt]


def coverage(drv: Driver) -> dict[str, int]:
    """What a run exercised: hits per tier, demotions, restores, live evictions, preemptions, aborts."""
    st = drv.sched.stats()
    out = {f"hit_{t}": sum(1 for s in drv.sent if s.req.cached_tokens and s.req.reuse_tier == t)
           for t in ("device", "kv_ram", "kv_disk")}
    out.update(demotions=st["reuse_demotions_total"], restores=st["reuse_restores_total"],
               live_evictions=st["live_evictions_total"], live_resumes=st["live_resumes_total"],
               preemptions=st["num_preemptions_total"], captures=st["reuse_captures_total"],
               skipped=st["reuse_captures_skipped_total"], aborted=sum(1 for s in drv.sent if s.end == "abort"),
               finished=sum(1 for s in drv.sent if s.end == "length"),
               hit_salted=sum(1 for s in drv.sent if s.req.cached_tokens and s.salt is not None))
    return out


def check_salts(drv: Driver) -> None:
    """Every request that resumed resumed an entry that only requests of its own salt (or, unsalted, only
    unsalted ones) captured under those key tokens: reuse never crosses salts."""
    for s in drv.sent:
        n = s.req.cached_tokens
        if n:
            makers = drv.creators.get(s.req.key_prefix(n))
            assert makers == {s.salt}, (s.rid, s.salt, n, makers)


def compare(drv: Driver, refs: References) -> int:
    """Check every finished, non-aborted request against its reference (and that reuse kept to salts);
    returns how many were compared."""
    check_salts(drv)
    compared = 0
    for s in drv.sent:
        if s.end in ("abort", "error"):
            continue
        assert s.end == "length", (s.rid, s.end)
        got = list(s.req.output_ids)
        assert len(got) == len(s.logprobs), (s.rid, len(got), len(s.logprobs))
        ref_tokens, ref_lps = refs.get(s.prompt, len(got))
        for i, (a, b) in enumerate(zip(got, ref_tokens)):
            if a != b:
                alt = dict(ref_lps[i].top).get(a)
                gap = ref_lps[i].token_logprob - alt if alt is not None else float("inf")
                assert gap <= NEAR_TIE, (
                    f"{s.rid} (cached {s.req.cached_tokens}, {s.req.reuse_kind}, {s.req.reuse_tier}): token {i} "
                    f"is {a}, cold picks {b} (cold gap {gap:.3g}); got {got}, cold {ref_tokens[:len(got)]}")
                break
            diff = abs(s.logprobs[i].token_logprob - ref_lps[i].token_logprob)
            assert diff <= LOGPROB_TOL, (
                f"{s.rid} (cached {s.req.cached_tokens}, {s.req.reuse_kind}, {s.req.reuse_tier}): token {i} "
                f"logprob differs from cold by {diff:.3g}")
        compared += 1
    return compared
