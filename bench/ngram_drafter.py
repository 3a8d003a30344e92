"""Prompt-lookup drafting: decode tokens/s with n-gram drafts against plain decode, where lookups hit and where not.

Two settings, each at 1 and 8 lanes, in one process (a scheduler and a model
runner, no sockets), greedy, K = 4 draft tokens against K = 0:

- ``loop``: a tiny random Qwen3.5-shaped checkpoint (built with transformers,
  seconds) whose greedy text falls into repeating runs, as a copying answer
  does: lookups hit and long runs are accepted. Its speedup is what prompt
  lookup gives at the acceptance it prints, not a figure for a real model.
- ``demo``: the demo model, whose greedy text over its 248K-token vocabulary
  never repeats: no lookup hits, so every round is a plain one; the ratio is
  what the drafter costs where it cannot help (its lookups only).

Outputs equal K = 0 are checked for every run (``outputs_equal``).

    python bench/ngram_drafter.py [--tokens 96] [--quick]

Last line: ``BENCH ngram_drafter speedup_loop_1=A speedup_loop_8=B accept_loop=C demo_ratio_1=D demo_ratio_8=E
outputs_equal=0|1``.
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

from drafter import decode_rate  # noqa: E402

K = 4


def prompts_for(vocab: int, lanes: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(2, vocab, (length,), generator=gen).tolist() for _ in range(lanes)]


def compare(name: str, model, prompts, tokens: int, vocab_limit, lookup: tuple[int, int]) -> tuple[float, int, int, bool]:
    """(speedup K = 4 over K = 0, accepted, drafted, outputs equal) for ``prompts``, one lane each."""
    from ignis.engine.ngram_drafter import NgramDrafter

    plain, _, _, want = decode_rate(model, None, prompts, 0, tokens, "cpu", vocab_limit)
    rate, acc, drafted, got = decode_rate(model, None, prompts, K, tokens, "cpu", vocab_limit,
                                          make_drafter=lambda m, s, k: NgramDrafter(m, s, k, *lookup, vocab_limit))
    print(f"{name:5s} lanes {len(prompts)}: K=0 {plain:8.1f}, K={K} {rate:8.1f} decode tokens/s "
          f"({rate / plain:.2f}x), acceptance {acc / drafted if drafted else 0:.3f} ({acc}/{drafted})")
    return rate / plain, acc, drafted, got == want


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per request")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="torch's math threads (default: the engine's, usable CPUs minus one)")
    ap.add_argument("--quick", action="store_true", help="24 tokens (the test suite's run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens = 24
    from ignis.engine.config import default_cpu_threads
    from ignis.engine.models.build import load_model
    from ignis.shared.demo import ensure_demo_model
    from ignis.shared.tokenizer_files import tokenizer_vocab_size
    from tests.engine.checkpoints import make_checkpoint

    torch.set_num_threads(args.cpu_threads or default_cpu_threads())
    t0 = time.perf_counter()
    tiny = make_checkpoint(Path(tempfile.mkdtemp(prefix="ignis-ngram-")), "qwen3_5")
    loop_model, _ = load_model(tiny.path)
    print(f"tiny checkpoint built in {time.perf_counter() - t0:.1f} s; {args.tokens} tokens per request, "
          f"K={K}, {torch.get_num_threads()} math thread(s)")
    demo_dir = ensure_demo_model()
    demo_model, _ = load_model(demo_dir)
    demo_limit = tokenizer_vocab_size(demo_dir)
    equal, speed, ratio, acc, drafted = True, {}, {}, 0, 0
    for lanes in (1, 8):
        s, a, d, same = compare("loop", loop_model, prompts_for(loop_model.cfg.vocab_size, lanes, 48), args.tokens,
                                None, (1, 3))
        speed[lanes], acc, drafted, equal = s, acc + a, drafted + d, equal and same
        r, _, _, same = compare("demo", demo_model, prompts_for(demo_limit, lanes, 48), args.tokens, demo_limit,
                                (2, 4))
        ratio[lanes], equal = r, equal and same
    print(f"BENCH ngram_drafter speedup_loop_1={speed[1]:.3f} speedup_loop_8={speed[8]:.3f} "
          f"accept_loop={acc / drafted if drafted else 0:.3f} demo_ratio_1={ratio[1]:.3f} demo_ratio_8={ratio[8]:.3f} "
          f"outputs_equal={int(equal)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
