"""Speculative decoding with the MTP drafter: decode tokens/s with K = 0, 1, 2, 3 draft tokens, at 1 and 8 lanes.

Build step (seconds, on the CPU): a copy of the demo model whose
multi-token-prediction head is fitted to the model's own greedy outputs on
the bench's prompts (``tests/engine/mtp_demo.py``). Then, in one process (a
scheduler and a model runner, no sockets), ``lanes`` greedy requests on those
prompts: once every lane decodes, the decode rounds are timed to the end.
Output equal to K = 0 is checked for every K (``outputs_equal``: 0 when some
K differed; in bf16 a near tie decided differently by the verify forward's
chunked kernels and the decode step's can do that). Acceptance: accepted /
drafted tokens. The speedups compare K = 2 with K = 0 at the same lane count.

    python bench/drafter.py [--device auto] [--dtype auto] [--tokens 96] [--quick]

Last line: ``BENCH drafter speedup_k2_1=A speedup_k2_8=B accept_k2=C outputs_equal=0|1``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402


def decode_rate(model, head, prompts: list[list[int]], k: int, tokens: int, device: str, vocab_limit: int | None,
                make_drafter=None):
    """(decode tokens/s once every lane decodes, accepted drafts, drafted tokens, outputs). ``make_drafter(model,
    state, k)``: the drafter (default: the head's ``SpecDecoder``)."""
    from ignis.engine.models.state import ModelState
    from ignis.engine.request import Request
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.engine.spec_decode import SpecDecoder
    from ignis.shared.sampling import SamplingParams

    lanes = len(prompts)
    ctx = max(len(p) for p in prompts) + tokens + 64
    pages = lanes * -(-ctx // 64) + 1
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=ctx,
                                      max_prefill_tokens_per_round=4096, speculative_tokens=k), reuse=False)
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=model.embed_tokens.weight.dtype,
                                device=device)
    runner = ModelRunner(model, state, device=device, vocab_limit=vocab_limit)
    if k:
        runner.use_drafter(make_drafter(model, state, k) if make_drafter is not None
                           else SpecDecoder(model, head, state, k, vocab_limit))
    runner.warm_up()
    reqs = [Request(f"r{i}", tuple(p), SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
            for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add(r)
    accepted = drafted = timed_tokens = 0
    started = None
    while sched.has_work:
        plan = sched.schedule()
        if started is None and len(plan.decodes) == lanes:
            if device == "cuda":
                torch.cuda.synchronize()
            started, timed_tokens = time.perf_counter(), 0
        result, _ = runner.run(plan)
        for ev in sched.update(result):
            runner.release(ev.req_id)
        if started is not None:
            timed_tokens += len(result.tokens) + sum(len(e) for e in result.extra.values())
            accepted += sum(len(e) for e in result.extra.values())
            drafted += sum(result.drafted.values())
    if device == "cuda":
        torch.cuda.synchronize()
    rate = timed_tokens / (time.perf_counter() - started)
    state.close()
    return rate, accepted, drafted, [list(r.output_ids) for r in reqs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--dtype", default=None, help="float32, bfloat16 (default: the checkpoint's on CPU, bf16 on CUDA)")
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per request")
    ap.add_argument("--fit-steps", type=int, default=150)
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="torch's math threads on the CPU (default: the engine's, usable CPUs minus one)")
    ap.add_argument("--quick", action="store_true", help="K = 0 and 2 only, 16 tokens (the test suite's run)")
    args = ap.parse_args(argv)
    from ignis.engine.models.build import drafter_from_checkpoint, load_model
    from tests.engine.mtp_demo import demo_prompts, demo_with_head

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    ks = (0, 2) if args.quick else (0, 1, 2, 3)
    if args.quick:
        args.tokens, args.fit_steps = 16, 60
    prompts = demo_prompts(8)
    from ignis.engine.config import default_cpu_threads

    threads = args.cpu_threads or default_cpu_threads()
    torch.set_num_threads(1)  # the fit's ops are tiny: more threads only wait on each other
    t0 = time.perf_counter()
    model_dir = demo_with_head(Path(tempfile.mkdtemp(prefix="ignis-drafter-")) / "demo-mtp", prompts,
                               max_tokens=args.tokens, steps=args.fit_steps)
    torch.set_num_threads(threads)
    print(f"head fitted to the demo's greedy outputs in {time.perf_counter() - t0:.1f} s; "
          f"{threads} math thread(s), {args.tokens} tokens per request")
    from ignis.shared.tokenizer_files import tokenizer_vocab_size

    model, ckpt = load_model(model_dir, dtype=args.dtype, device=device)
    head = drafter_from_checkpoint(ckpt)
    vocab_limit = tokenizer_vocab_size(model_dir)
    rates, accept, equal = {}, {}, 1
    for lanes in (1, 8):
        want = None
        for k in ks:
            rate, acc, drafted, outputs = decode_rate(model, head, prompts[:lanes], k, args.tokens, device,
                                                      vocab_limit)
            if want is None:
                want = outputs
            elif outputs != want:
                print(f"K={k} lanes={lanes}: output differs from K=0")
                equal = 0
            rates[k, lanes] = rate
            accept[k, lanes] = acc / drafted if drafted else 0.0
            print(f"lanes {lanes} K={k}: {rate:8.1f} decode tokens/s, acceptance {accept[k, lanes]:.3f} "
                  f"({acc}/{drafted})")
    a, b = rates[2, 1] / rates[0, 1], rates[2, 8] / rates[0, 8]
    print(f"BENCH drafter speedup_k2_1={a:.3f} speedup_k2_8={b:.3f} accept_k2={accept[2, 8]:.3f} "
          f"outputs_equal={equal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
