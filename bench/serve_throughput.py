"""Serving throughput: generated tokens/s of the engine vs transformers' batched generate.

For 1, 8 and 32 concurrent requests (same prompts, same output lengths on
both sides) it measures the wall time from sending every request to the last
token. Ours runs the real engine process over ZeroMQ; the reference runs
transformers' ``generate`` on the whole batch at once (greedy, its default
dynamic cache, fp32: the fastest CPU generation it offers this model family,
whose hybrid cache has no static form). It also runs ``bench/round_cost.py``:
an engine round at 32 lanes against the bare forward of the same batch.
Last line: ``BENCH serve_throughput vocab=N ratio_1=X ratio_8=Y ratio_32=Z
round_vs_forward_32=D`` (ratios: ours / transformers).

    python bench/serve_throughput.py [--model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from tests.engine.engine_process import EngineProcess  # noqa: E402


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def ours(engine: EngineProcess, batch: list[list[int]], new_tokens: int, tag: str) -> float:
    t0 = time.perf_counter()
    rids = [f"{tag}-{i}" for i in range(len(batch))]
    for rid, p in zip(rids, batch):
        engine.generate(rid, p, max_tokens=new_tokens, ignore_eos=True)
    outs = engine.wait(rids, timeout=600)
    wall = time.perf_counter() - t0
    produced = sum(len(o.tokens) for o in outs.values())
    if produced != len(batch) * new_tokens:
        raise RuntimeError(f"expected {len(batch) * new_tokens} tokens, got {produced}")
    return produced / wall


def reference(model, batch: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(batch)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        wall = time.perf_counter() - t0
    return (out.shape[1] - ids.shape[1]) * len(batch) / wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    concurrency = (1, 8, 32)
    if args.quick:
        args.prompt_tokens, args.new_tokens = 16, 4

    from transformers import AutoModelForCausalLM

    from ignis.engine.models.config import load_config
    from ignis.shared.tokenizer_files import tokenizer_vocab_size

    if args.model is None:
        from ignis.shared.demo import ensure_demo_model
        args.model = str(ensure_demo_model())
    vocab = tokenizer_vocab_size(args.model) or load_config(args.model).vocab_size
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ignis-bench-") as rt:
        ctx = args.prompt_tokens + args.new_tokens + 64
        engine = EngineProcess(Path(rt), "--model", args.model, "--decode-lanes", "32",
                               "--kv-pool-tokens", str(32 * ctx), "--max-prefill-tokens-per-round", "4096")
        try:
            ours(engine, prompts(2, args.prompt_tokens, vocab, 0), 2, "warm")
            for n in concurrency:
                batch = prompts(n, args.prompt_tokens, vocab, n)
                o = ours(engine, batch, args.new_tokens, f"c{n}")
                r = reference(hf, batch, args.new_tokens)
                rows.append((n, o, r))
        finally:
            engine.stop()
    from round_cost import round_vs_forward

    round_ms, forward_ms = round_vs_forward(args.model, 32, 3 if args.quick else 30)
    print(f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens per request, vocab {vocab}")
    print(f"{'concurrency':<12}{'ours tok/s':>12}{'transformers tok/s':>20}{'ratio':>8}")
    for n, o, r in rows:
        print(f"{n:<12}{o:>12.1f}{r:>20.1f}{o / r:>8.2f}")
    ratios = {n: o / r for n, o, r in rows}
    print(f"engine round at 32 lanes {round_ms:.2f} ms, bare forward of the same batch {forward_ms:.2f} ms")
    print(f"BENCH serve_throughput vocab={vocab} ratio_1={ratios[1]:.3f} ratio_8={ratios[8]:.3f} "
          f"ratio_32={ratios[32]:.3f} round_vs_forward_32={round_ms / forward_ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
