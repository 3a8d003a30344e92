"""What the engine loop's bookkeeping costs as prompts grow: the costs that stall every running stream.

In one process, on the CPU, with no model (a scheduler whose rounds are answered with a fixed token):

    head_wait      one round with 4 decoding lanes while a long prompt waits at the queue's head for pages
                   (its lookups run every round), against the same round without it
    lower_match    one lookup through the engine's records of entries it demoted to tierd (records of
                   long prompts sharing a system prompt, none of them a prefix of the new prompt)
    rep_penalty    one sampling step's repetition_penalty at a long prompt (random ids over the real
                   248K vocabulary), after 2,000 output tokens
    stats          the scheduler's stats (the gauges' source, read every loop turn) with 32 retained
                   entries of long prompts

The last line is ``BENCH loop_costs head_wait_ms=A head_wait_base_ms=B lower_match_ms=C rep_penalty_ms=D
stats_ms=E prompt_tokens=N records=R``: milliseconds each at N prompt tokens and R records.

    python bench/loop_costs.py [--prompt-tokens 120000] [--records 1024] [--entries 32] [--quick]
"""

from __future__ import annotations

import argparse
import random
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

VOCAB = 248_320


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150_000) for _ in range(n)]


class Sim:
    """A scheduler driven without a model: every sampled request gets token 7 (never a stop)."""

    def __init__(self, lanes: int, max_len: int, pool_tokens: int, host_slots: int):
        from ignis.engine.scheduler import Scheduler
        from ignis.engine.scheduler_config import SchedulerConfig

        cfg = SchedulerConfig(decode_lanes=lanes, num_pages=pool_tokens // 64, max_model_len=max_len,
                              max_queue=4096)
        self.s = Scheduler(cfg, device_slots=0, host_slots=host_slots)
        self.n = 0

    def add(self, prompt: list[int], max_tokens: int, system_end: int | None = None,
            opener_start: int | None = None) -> str:
        from ignis.engine.request import Request, capture_cuts
        from ignis.shared.sampling import SamplingParams

        self.n += 1
        p = tuple(prompt)
        req = Request(req_id=f"r{self.n}", prompt_ids=p, sampling=SamplingParams(max_tokens=max_tokens),
                      request_class="agent", system_end=system_end, opener_start=opener_start, last_is_user=True,
                      must_cut_at=capture_cuts(len(p), system_end, opener_start, 64))
        self.s.add(req)
        return req.req_id

    def step(self) -> None:
        from ignis.engine.schedule import RoundResult

        plan = self.s.schedule()
        if not plan.is_empty:
            self.s.update(RoundResult(tokens={rid: 7 for rid in plan.sampled_ids()}))

    def state(self, rid: str) -> str | None:
        req = self.s.get(rid)
        return None if req is None else req.state.value


def _mean_ms(fn, n: int) -> float:
    fn()  # a first call pays one-time costs (torch's first ops, an index built at first use)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def head_wait(prompt_tokens: int, rounds: int) -> tuple[float, float]:
    sim = Sim(lanes=8, max_len=prompt_tokens + 4096, pool_tokens=int(4.5 * prompt_tokens) + 1024, host_slots=16)
    running = [sim.add(_tokens(prompt_tokens, 10 + i), 1_000_000) for i in range(4)]
    while any(sim.state(r) != "decoding" for r in running):
        sim.step()
    head = sim.add(_tokens(prompt_tokens, 99), 10)
    waiting = _mean_ms(sim.step, rounds)
    if sim.state(head) != "waiting":
        raise RuntimeError(f"the head should still wait for pages, it is {sim.state(head)}")
    sim.s.abort(head)
    return waiting, _mean_ms(sim.step, rounds)


def lower_match(prompt_tokens: int, records: int) -> float:
    from ignis.engine.reuse.lower_index import LowerIndex, LowerRecord

    index = LowerIndex({"ram": 1, "disk": 1}, limit=records, token_limit=records * prompt_tokens)
    system = _tokens(prompt_tokens // 2, 1)
    for i in range(records):
        index.add(LowerRecord(f"k{i}", system + _tokens(prompt_tokens // 4, 100 + i), "retained", "agent", True,
                              "ram"))
    prompt = tuple(system + _tokens(prompt_tokens // 2, 7))
    return _mean_ms(lambda: index.matches(prompt, len(prompt) - 1), 5)


def rep_penalty(prompt_tokens: int) -> float:
    import torch

    from ignis.engine.sampling import SamplerState, _apply_penalties
    from ignis.shared.sampling import SamplingParams

    torch.set_num_threads(1)
    rng = random.Random(0)
    st = SamplerState.from_params(SamplingParams(temperature=1.0, repetition_penalty=1.05),
                                  [rng.randrange(VOCAB) for _ in range(prompt_tokens)])
    for _ in range(2000):
        st.record(rng.randrange(VOCAB))
    row = torch.randn(VOCAB)

    def one() -> None:
        _apply_penalties(row, st)
        st.record(rng.randrange(VOCAB))

    return _mean_ms(one, 20)


def stats(prompt_tokens: int, entries: int) -> float:
    sim = Sim(lanes=16, max_len=prompt_tokens + 4096, pool_tokens=(entries + 4) * (prompt_tokens + 4096),
              host_slots=entries)
    system = _tokens(prompt_tokens // 8, 1)
    for i in range(entries + 4):
        rid = sim.add(system + _tokens(prompt_tokens - len(system), 100 + i), 1, system_end=len(system),
                      opener_start=prompt_tokens - 5)
        while sim.state(rid) is not None:
            sim.step()
    return _mean_ms(sim.s.stats, 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=120_000)
    ap.add_argument("--records", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="small sizes (for tests)")
    args = ap.parse_args()
    if args.quick:
        args.prompt_tokens, args.records, args.entries = 4000, 64, 4
    n = args.prompt_tokens
    waiting, base = head_wait(n, 10 if args.quick else 40)
    match = lower_match(n, args.records)
    penalty = rep_penalty(n)
    gauges = stats(n, args.entries)
    print(f"{'cost':<28}{'ms':>10}")
    print(f"{'round, head waiting':<28}{waiting:>10.3f}")
    print(f"{'round, no head':<28}{base:>10.3f}")
    print(f"{f'lower match, {args.records} records':<28}{match:>10.3f}")
    print(f"{'repetition_penalty step':<28}{penalty:>10.3f}")
    print(f"{f'stats, {args.entries} entries':<28}{gauges:>10.3f}")
    print(f"# prompts of {n} tokens, one process, one math thread for the sampler")
    print(f"BENCH loop_costs head_wait_ms={waiting:.4f} head_wait_base_ms={base:.4f} lower_match_ms={match:.4f} "
          f"rep_penalty_ms={penalty:.4f} stats_ms={gauges:.4f} prompt_tokens={n} records={args.records}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
