"""The LM head and the sampler at a 248,320-entry vocabulary, against the rest of a decode round, on CPU.

A model of the demo model's shape (hidden 128, 8 layers) but with the real
Qwen3.5 vocabulary runs decode rounds at 32 lanes. Per round it times the
whole forward, the LM head alone (final-norm rows times the tied embedding,
[lanes, hidden] x [hidden, vocab]) and ``sample_batch`` on the round's logits
under four sampling settings; "rest" is the forward less the head. Then a
torch profile of a few rounds (forward and sampling at the recommended
setting) gives the top operators by self time. Times are best of a few
repetitions, on ``--threads`` intra-op threads (default 1: one core, so the
figures do not hang on what else the machine runs). Last line::

    BENCH lm_head vocab=V lanes=L hidden=H threads=N head_ms=A rest_ms=B sample_greedy_ms=C sample_default_ms=D
        sample_recommended_ms=E sample_top_p_ms=F head_sampler_share=G

``head_sampler_share`` is (head + sampling at the recommended setting) over
(forward + that sampling).

    python bench/lm_head.py [--lanes 32] [--vocab 248320] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from ignis.engine.forward_batch import ForwardBatch, SeqChunk  # noqa: E402
from ignis.engine.models.config import PAGE_TOKENS, config_from_dict  # noqa: E402
from ignis.engine.models.hybrid import HybridModel  # noqa: E402
from ignis.engine.models.state import ModelState  # noqa: E402
from ignis.engine.sampling import SamplerState, sample_batch  # noqa: E402
from ignis.shared.demo.builder import model_config  # noqa: E402
from ignis.shared.sampling import SamplingParams  # noqa: E402

QWEN35_VOCAB = 248_320
CONTEXT = 128  # tokens already in each lane's context when the timed decode rounds run
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "default": SamplingParams(),
    "recommended": SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
    "top_p": SamplingParams(top_p=0.95),
}


def best_of(reps: int, fn) -> float:
    """Best wall time of ``reps`` calls after one untimed call, in milliseconds."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


class DecodeRound:
    """One decode step of ``lanes`` sequences at position ``CONTEXT``, repeatable (each lane rewrites one slot)."""

    def __init__(self, model: HybridModel, lanes: int):
        self.model = model
        pages = -(-(CONTEXT + 1) // PAGE_TOKENS)
        self.state = ModelState.allocate(model.cfg, num_pages=lanes * pages, lanes=lanes, dtype=torch.float32)
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, model.cfg.vocab_size, (lanes,), generator=gen).tolist()
        self.batch = ForwardBatch.build(
            [SeqChunk([t], CONTEXT, list(range(i * pages, (i + 1) * pages)), i) for i, t in enumerate(tokens)])
        self.head_input = torch.randn(lanes, model.cfg.hidden_size, generator=gen)

    def forward(self) -> torch.Tensor:
        return self.model(self.batch, self.state)

    def head(self) -> torch.Tensor:
        return torch.nn.functional.linear(self.head_input, self.model.head_weight())


def sampler_call(logits: torch.Tensor, params: SamplingParams):
    states = [SamplerState.from_params(params, []) for _ in range(logits.shape[0])]
    want = [None] * logits.shape[0]
    return lambda: sample_batch(logits, states, want)


def top_ops(fn, rounds: int, count: int) -> list[tuple[str, float, int]]:
    """(operator, self CPU ms per round, calls per round) of the ``count`` costliest operators."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1e3 / rounds, e.count // rounds) for e in events[:count]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=QWEN35_VOCAB)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile-rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    args = ap.parse_args(argv)
    if args.quick:
        args.lanes, args.vocab, args.reps, args.profile_rounds = 4, 8192, 1, 1

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = config_from_dict(model_config(args.vocab, eos_id=1, pad_id=0))
    model = HybridModel(cfg).eval()
    rnd = DecodeRound(model, args.lanes)
    logits = rnd.forward()

    forward_ms = best_of(args.reps, rnd.forward)
    head_ms = best_of(args.reps, rnd.head)
    rest_ms = max(forward_ms - head_ms, 0.0)
    sample_ms = {name: best_of(args.reps, sampler_call(logits, p)) for name, p in SETTINGS.items()}

    print(f"decode round: {args.lanes} lanes, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'part':<34}{'ms/round':>10}")
    print(f"{'forward (whole)':<34}{forward_ms:>10.2f}")
    print(f"{'  LM head':<34}{head_ms:>10.2f}")
    print(f"{'  rest (embedding, layers, norm)':<34}{rest_ms:>10.2f}")
    for name, ms in sample_ms.items():
        print(f"{'sampler, ' + name:<34}{ms:>10.2f}")

    recommended = sampler_call(logits, SETTINGS["recommended"])
    ops = top_ops(lambda: (rnd.forward(), recommended()), args.profile_rounds, 8)
    print("\nprofile, forward + sampling (recommended), top operators by self CPU time:")
    print(f"{'operator':<34}{'ms/round':>10}{'calls':>8}")
    for name, ms, calls in ops:
        print(f"{name:<34}{ms:>10.2f}{calls:>8}")

    share = (head_ms + sample_ms["recommended"]) / (forward_ms + sample_ms["recommended"])
    print(f"BENCH lm_head vocab={cfg.vocab_size} lanes={args.lanes} hidden={cfg.hidden_size} threads={args.threads} "
          f"head_ms={head_ms:.3f} rest_ms={rest_ms:.3f} sample_greedy_ms={sample_ms['greedy']:.3f} "
          f"sample_default_ms={sample_ms['default']:.3f} sample_recommended_ms={sample_ms['recommended']:.3f} "
          f"sample_top_p_ms={sample_ms['top_p']:.3f} head_sampler_share={share:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
