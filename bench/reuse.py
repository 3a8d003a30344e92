"""Prompt reuse on the demo model, side by side in one run.

- cold vs warm TTFT at 1K, 8K and 32K-token prompts (warm = the same prompt
  again, resuming from its prompt checkpoint);
- the short-prompt tax: TTFT of cold 1K prompts with reuse on (a system mark
  and the opener: one traversal keeping two images) vs an engine with
  ``--reuse-prompt off``, the two asked in turns (the median of the pairs' ratios);
- an 8-subagent burst on a 16K system block (the size of an agent client's
  system and tools block in the replayed traces) already read once: prompt tokens
  actually prefilled and total time, with vs without reuse;
- a COLD burst: 8 subagents on a fresh 16K block arriving at once, no lead
  request: prompt tokens prefilled with vs without reuse (the block should be
  read once: the optimum is (block + 8 tails) / 8 (block + tail)), and whether
  every greedy output equals the reuse-off engine's;
- the same cold burst with no system mark (a preamble the prompts share that
  no mark predicts: the second arrival learns the point, the first captures
  it, the others wait for it): prefilled tokens with vs without reuse;
- warm TTFT at 32K over the cold TTFT of a 16-token prompt.

Last line: ``BENCH reuse vocab=N warm_cold_1k=A warm_cold_8k=B warm_cold_32k=C
short_tax=D burst_prefill_ratio=E cold_burst_prefill_ratio=F
cold_burst_identical=G warm32k_vs_short=H preamble_burst_prefill_ratio=I
preamble_burst_identical=J cold_burst_optimum=K`` (the demo tokenizer's vocabulary size, warm/cold TTFT, on/off TTFT,
prefilled tokens with/without reuse, the fraction of cold-burst outputs equal
to reuse off, warm 32K / cold 16-token TTFT, the cold burst's optimum ratio).

    python bench/reuse.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

use_checkout()

from ignis.shared.demo.tokenizer import TOKENIZER_SIZE  # noqa: E402
from tests.engine.engine_process import EngineProcess  # noqa: E402



def tokens(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(TOKENIZER_SIZE) for _ in range(n)]


def ttft(engine: EngineProcess, rid: str, prompt: list[int], system_end: int | None = None) -> tuple[float, int]:
    out = engine.run(rid, prompt, timeout=900, max_tokens=1, system_end=system_end, opener_start=len(prompt) - 3)
    if out.finished is None:
        raise RuntimeError(f"{rid}: {out.refused}")
    return out.finished.timings.ttft_ms, out.finished.usage.cached_tokens


def burst(engine: EngineProcess, tag: str, block: list[int], tasks: list[list[int]]) -> tuple[int, float]:
    ttft(engine, f"{tag}-lead", block + tasks[0][:50], system_end=len(block))
    t0 = time.perf_counter()
    rids = []
    for i, task in enumerate(tasks):
        p = block + task
        rid = f"{tag}-{i}"
        engine.generate(rid, p, max_tokens=4, ignore_eos=True, system_end=len(block), opener_start=len(p) - 3)
        rids.append(rid)
    outs = engine.wait(rids, timeout=900)
    wall = time.perf_counter() - t0
    prefilled = sum(o.finished.usage.prompt_tokens - o.finished.usage.cached_tokens for o in outs.values())
    return prefilled, wall


def cold_burst(engine: EngineProcess, tag: str, block: list[int], tasks: list[list[int]], marked: bool = True
               ) -> tuple[int, dict[str, list[int]]]:
    """Every request of the burst sent before any is served: prefilled tokens and each output.
    ``marked`` False: no system mark (the block is a preamble the requests share by chance)."""
    rids = []
    for i, task in enumerate(tasks):
        p = block + task
        rid = f"{tag}-{i}"
        engine.generate(rid, p, max_tokens=8, ignore_eos=True, request_class="agent",
                        system_end=len(block) if marked else None, opener_start=len(p) - 3)
        rids.append(rid)
    outs = engine.wait(rids, timeout=900)
    prefilled = sum(o.finished.usage.prompt_tokens - o.finished.usage.cached_tokens for o in outs.values())
    return prefilled, {rid.split("-")[-1]: outs[rid].tokens for rid in rids}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for the test suite")
    args = ap.parse_args(argv)
    sizes = {"1k": 1024, "8k": 8192, "32k": 32000}
    block_len, task_len, repeats = 16384, 256, 3
    if args.quick:
        sizes = {"1k": 128, "8k": 256, "32k": 512}
        block_len, task_len, repeats = 256, 32, 1
    rng = random.Random(0)
    pool = str(4 * max(sizes.values()) + 16 * (block_len + task_len) + 8192)
    common = ["--decode-lanes", "8", "--kv-pool-tokens", pool, "--max-prefill-tokens-per-round", "4096"]
    rows, results, warm_ms = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="ignis-bench-") as rt_on, \
            tempfile.TemporaryDirectory(prefix="ignis-bench-") as rt_off:
        on = EngineProcess(Path(rt_on), *common)
        off = EngineProcess(Path(rt_off), *common, "--reuse-prompt", "off")
        try:
            for eng, tag in ((on, "w-on"), (off, "w-off")):
                ttft(eng, tag, tokens(64, rng))
            for name, n in sizes.items():
                p = tokens(n, rng)
                cold, _ = ttft(on, f"cold-{name}", p)
                warms = [ttft(on, f"warm-{name}-{i}", p) for i in range(repeats)]  # the median of a few
                warm, cached = statistics.median(w for w, _ in warms), min(c for _, c in warms)
                results[f"warm_cold_{name}"] = warm / cold
                warm_ms[name] = warm
                rows.append((f"ttft {name} cold / warm ms", cold, warm, f"cached {cached}"))
            taxed, plain = [], []
            for i in range(8 * repeats + 1):  # on and off in turns, so both see the same load
                taxed.append(ttft(on, f"tax-on-{i}", tokens(sizes["1k"], rng), system_end=sizes["1k"] // 2)[0])
                plain.append(ttft(off, f"tax-off-{i}", tokens(sizes["1k"], rng), system_end=sizes["1k"] // 2)[0])
            results["short_tax"] = statistics.median(a / b for a, b in zip(taxed, plain))
            rows.append(("cold 1k ttft ms reuse on / off", statistics.median(taxed), statistics.median(plain), ""))
            block = tokens(block_len, rng)
            tasks = [tokens(task_len, rng) for _ in range(8)]
            pre_on, wall_on = burst(on, "b-on", block, tasks)
            pre_off, wall_off = burst(off, "b-off", block, tasks)
            results["burst_prefill_ratio"] = pre_on / pre_off
            rows.append(("burst prefilled tokens on / off", pre_on, pre_off, ""))
            rows.append(("burst total s on / off", wall_on, wall_off, ""))
            block = tokens(block_len, rng)
            tasks = [tokens(task_len, rng) for _ in range(8)]
            cold_on, outs_on = cold_burst(on, "cb-on", block, tasks)
            cold_off, outs_off = cold_burst(off, "cb-off", block, tasks)
            optimum = (block_len + 8 * task_len) / (8 * (block_len + task_len))
            results["cold_burst_prefill_ratio"] = cold_on / cold_off
            results["cold_burst_identical"] = sum(outs_on[k] == outs_off[k] for k in outs_off) / len(outs_off)
            results["cold_burst_optimum"] = optimum
            rows.append(("cold burst prefilled on / off", cold_on, cold_off, f"optimum ratio {optimum:.3f}"))
            block = tokens(block_len, rng)
            tasks = [tokens(task_len, rng) for _ in range(8)]
            pre_on, outs_on = cold_burst(on, "pb-on", block, tasks, marked=False)
            pre_off, outs_off = cold_burst(off, "pb-off", block, tasks, marked=False)
            results["preamble_burst_prefill_ratio"] = pre_on / pre_off
            results["preamble_burst_identical"] = sum(outs_on[k] == outs_off[k] for k in outs_off) / len(outs_off)
            rows.append(("unmarked burst prefilled on / off", pre_on, pre_off, "the preamble has no mark"))
            short = statistics.median(ttft(on, f"short-{i}", tokens(16, rng))[0] for i in range(repeats))
            results["warm32k_vs_short"] = warm_ms["32k"] / short
            rows.append(("ttft warm 32k / cold 16-token ms", warm_ms["32k"], short, ""))
        finally:
            on.stop()
            off.stop()
    print(f"{'case':<34}{'A':>12}{'B':>12}  note")
    for name, a, b, note in rows:
        print(f"{name:<34}{a:>12.1f}{b:>12.1f}  {note}")
    print(f"BENCH reuse vocab={TOKENIZER_SIZE} " + " ".join(f"{k}={results[k]:.3f}" for k in
                                    ("warm_cold_1k", "warm_cold_8k", "warm_cold_32k", "short_tax",
                                     "burst_prefill_ratio", "cold_burst_prefill_ratio", "cold_burst_identical",
                                     "warm32k_vs_short", "preamble_burst_prefill_ratio",
                                     "preamble_burst_identical", "cold_burst_optimum")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
