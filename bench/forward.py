"""Forward speed: ours vs transformers on the same checkpoint, side by side in one run.

Measures prefill tokens/s (one sequence) and decode tokens/s at batch 1 and
16, best of a few repetitions each, and prints a table. The last line is
``BENCH forward prefill_ratio=X decode1_ratio=Y decode16_ratio=Z`` (ours /
transformers; above 1 means we are faster).

    python bench/forward.py [--model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from ignis.engine.forward_batch import ForwardBatch, SeqChunk  # noqa: E402
from ignis.engine.models.build import load_model  # noqa: E402
from ignis.engine.models.config import PAGE_TOKENS  # noqa: E402
from ignis.engine.models.state import ModelState  # noqa: E402


def best_of(reps: int, fn) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class Ours:
    def __init__(self, model, lanes: int, context: int):
        self.model = model
        pages_per_seq = (context + PAGE_TOKENS - 1) // PAGE_TOKENS
        self.state = ModelState.allocate(model.cfg, num_pages=lanes * pages_per_seq, lanes=lanes,
                                         dtype=model.embed_tokens.weight.dtype)
        self.tables = [list(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(lanes)]

    def prefill(self, prompts: list[list[int]]):
        for lane, p in enumerate(prompts):
            self.state.reset_lane(lane)
        batch = ForwardBatch.build([SeqChunk(p, 0, self.tables[i], i) for i, p in enumerate(prompts)])
        return self.model(batch, self.state)

    def decode(self, prompts: list[list[int]], steps: int) -> float:
        """Seconds for ``steps`` decode steps after an (untimed) prefill."""
        tokens = self.prefill(prompts).argmax(-1).tolist()
        pos = [len(p) for p in prompts]
        t0 = time.perf_counter()
        for _ in range(steps):
            batch = ForwardBatch.build([SeqChunk([t], pos[i], self.tables[i], i) for i, t in enumerate(tokens)])
            tokens = self.model(batch, self.state).argmax(-1).tolist()
            pos = [p + 1 for p in pos]
        return time.perf_counter() - t0


class Reference:
    def __init__(self, hf_model):
        self.model = hf_model

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]):
        return self.model(torch.tensor(prompts)).logits[:, -1]

    @torch.inference_mode()
    def decode(self, prompts: list[list[int]], steps: int) -> float:
        out = self.model(torch.tensor(prompts), use_cache=True)
        cache, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = self.model(tok, cache=cache, use_cache=True)
            cache, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--prefill-tokens", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length before decoding")
    args = ap.parse_args(argv)
    if args.quick:
        args.prefill_tokens, args.decode_steps, args.prompt_tokens = 64, 4, 16
    reps = 1 if args.quick else 3

    from transformers import AutoModelForCausalLM

    if args.model is None:
        from ignis.shared.demo import ensure_demo_model
        args.model = str(ensure_demo_model())
    model, ckpt = load_model(args.model, dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = ckpt.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompts(n, length):
        return torch.randint(0, vocab, (n, length), generator=gen).tolist()

    ctx = max(args.prefill_tokens, args.prompt_tokens + args.decode_steps + 1)
    ours1, ours16 = Ours(model, 1, ctx), Ours(model, 16, ctx)
    ref = Reference(hf)
    rows = []
    p = prompts(1, args.prefill_tokens)
    t_ours = best_of(reps, lambda: ours1.prefill(p))
    t_ref = best_of(reps, lambda: ref.prefill(p))
    rows.append(("prefill b=1", args.prefill_tokens / t_ours, args.prefill_tokens / t_ref))
    for bsz, ours in ((1, ours1), (16, ours16)):
        p = prompts(bsz, args.prompt_tokens)
        steps = args.decode_steps
        t_o = min(ours.decode(p, steps) for _ in range(reps))
        t_r = min(ref.decode(p, steps) for _ in range(reps))
        rows.append((f"decode b={bsz}", bsz * steps / t_o, bsz * steps / t_r))

    print(f"{'case':<14}{'ours tok/s':>14}{'transformers tok/s':>20}{'ratio':>8}")
    ratios = []
    for name, o, r in rows:
        ratios.append(o / r)
        print(f"{name:<14}{o:>14.1f}{r:>20.1f}{o / r:>8.2f}")
    print(f"BENCH forward prefill_ratio={ratios[0]:.3f} decode1_ratio={ratios[1]:.3f} "
          f"decode16_ratio={ratios[2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
