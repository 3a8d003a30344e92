"""What an engine round costs beyond its forward: the same decode batch, with and without the engine around it.

In one process, on the CPU: a scheduler and a model runner (no sockets) run
``lanes`` greedy requests; once every lane decodes, ``steps`` rounds are timed
(schedule, forward, sampling, update), then the bare model forward of the same
decode batch, ``steps`` times. The ratio is the engine's overhead per round:
1.0 means a round costs exactly its forward.

    python bench/round_cost.py [--model DIR] [--lanes 32] [--steps 30] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from checkout import use_checkout  # noqa: E402

use_checkout()


def round_vs_forward(model_dir: str, lanes: int, steps: int, prompt_tokens: int = 64) -> tuple[float, float]:
    """(milliseconds per engine round, milliseconds per bare forward) for ``lanes`` decoding lanes."""
    from ignis.engine.forward_batch import ForwardBatch, SeqChunk
    from ignis.engine.models.build import load_model
    from ignis.engine.models.state import ModelState
    from ignis.engine.request import Request
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.tokenizer_files import tokenizer_vocab_size

    model, _ = load_model(model_dir)
    vocab = tokenizer_vocab_size(model_dir) or model.cfg.vocab_size
    ctx = prompt_tokens + 3 * steps + 64
    pages = lanes * -(-ctx // 64)
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=ctx,
                                      max_prefill_tokens_per_round=lanes * prompt_tokens), host_slots=0, reuse=False)
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=next(model.parameters()).dtype)
    runner = ModelRunner(model, state, vocab_limit=vocab)
    runner.warm_up()
    rng = random.Random(0)
    for i in range(lanes):
        sched.add(Request(f"r{i}", tuple(rng.randrange(3, vocab) for _ in range(prompt_tokens)),
                          SamplingParams(temperature=0.0, max_tokens=3 * steps, ignore_eos=True)))

    def one_round():
        plan = sched.schedule()
        result, _ = runner.run(plan)
        for ev in sched.update(result):
            runner.release(ev.req_id)
        return plan

    while len(one_round().decodes) < lanes:  # the prefills, then the first all-decode round
        pass
    t0 = time.perf_counter()
    for _ in range(steps):
        one_round()
    round_ms = (time.perf_counter() - t0) * 1e3 / steps
    plan = sched.schedule()
    batch = ForwardBatch.build([SeqChunk([d.token_id], d.position, list(d.pages), d.lane) for d in plan.decodes])
    t0 = time.perf_counter()
    for _ in range(steps):
        model(batch, state)
    forward_ms = (time.perf_counter() - t0) * 1e3 / steps
    state.close()
    return round_ms, forward_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="4 lanes, 3 rounds (the test suite's run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.lanes, args.steps = 4, 3
    if args.model is None:
        from ignis.shared.demo import ensure_demo_model
        args.model = str(ensure_demo_model())
    round_ms, forward_ms = round_vs_forward(args.model, args.lanes, args.steps)
    print(f"lanes {args.lanes}: round {round_ms:.2f} ms, bare forward {forward_ms:.2f} ms")
    print(f"BENCH round_cost lanes={args.lanes} round_ms={round_ms:.2f} forward_ms={forward_ms:.2f} "
          f"round_vs_forward={round_ms / forward_ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
