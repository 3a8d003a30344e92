"""gpu_check section ``engine``: the real ``ignis engine`` process on the device, both families.

For a small random checkpoint of each family (written with transformers, bf16,
head dims of 64: real tile shapes, seconds to load) it starts the engine
twice, with decode CUDA graphs (the default) and with ``--cuda-graph-max-bs
0``, sends the same concurrent greedy requests to both and checks:

- the engine starts on the Triton path (its stats name no twin op) and, in the
  first run, captured its decode graphs;
- every request's greedy tokens are the same with and without the graphs;
- a prompt sent again resumes from its checkpoint (cached tokens) and gives
  the tokens it gave the first time.

It reports the engine's start time, the decode tokens/s of the burst and the
Triton compiles the engine made while serving (``engine_compiles_while_serving``
in the BENCH line: variants its warm-up missed, each a stall; 0 is the goal;
"n/a" on the CPU, where nothing compiles). The dry run does the same on the CPU
for the dense family only.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from gpu_check_report import Report
from gpu_check_shapes import Shapes

SHAPE = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "linear_key_head_dim": 64, "linear_value_head_dim": 64, "max_position_embeddings": 4096}
LANES, NEW_TOKENS = 8, 24


def _serve(model_dir: Path, device: str, flags: list[str], prompts: list[list[int]], tag: str) -> dict:
    """One engine run: its stats, each prompt's tokens, the repeat's cached tokens and tokens, timings."""
    from tests.engine.engine_process import EngineProcess

    with tempfile.TemporaryDirectory(prefix="ignis-gpu-engine-") as rt:
        t0 = time.monotonic()
        eng = EngineProcess(Path(rt), "--device", device, "--decode-lanes", str(LANES), "--kv-pool-tokens", "32768",
                            *flags, model=str(model_dir), startup_timeout=300)
        try:
            started = time.monotonic() - t0
            stats = eng.stats()
            t0 = time.monotonic()
            rids = [f"{tag}-{i}" for i in range(len(prompts))]
            for rid, p in zip(rids, prompts):
                eng.generate(rid, p, max_tokens=NEW_TOKENS, ignore_eos=True, opener_start=len(p) - 3)
            outs = eng.wait(rids, timeout=300)
            burst_s = time.monotonic() - t0
            again = eng.run(f"{tag}-again", prompts[0], timeout=300, max_tokens=NEW_TOKENS, ignore_eos=True,
                            opener_start=len(prompts[0]) - 3)
            compiled = eng.stats().get("kernel_compiles_while_serving")
        finally:
            eng.stop()
    bad = [rid for rid in rids if outs[rid].finished is None]
    return {"stats": stats, "start_s": started, "burst_s": burst_s, "bad": bad, "compiled": compiled,
            "tokens": [outs[rid].tokens for rid in rids], "again_tokens": again.tokens,
            "again_cached": again.finished.usage.cached_tokens if again.finished else 0}


def run_engine(rep: Report, shapes: Shapes, device: str, deadline: float, head: dict) -> None:
    from tests.engine.checkpoints import make_checkpoint

    families = ("qwen3_5", "qwen3_next") if device == "cuda" else ("qwen3_5",)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, SHAPE["vocab_size"]) for _ in range(n)] for n in (40, 77, 128, 200, 300, 65)]
    same_all = True
    compiles_total = 0  # Triton variants the warm-up missed (kernels.compile_watch): 0 is the goal
    with tempfile.TemporaryDirectory(prefix="ignis-gpu-ckpt-") as tmp:
        for family in families:
            if time.monotonic() > deadline:
                rep.say(f"engine: past the deadline, {family} skipped")
                continue
            ckpt = make_checkpoint(tmp, family, dtype="bfloat16", config_overrides=SHAPE)
            runs = {}
            for mode, flags in (("graphs", []), ("eager", ["--cuda-graph-max-bs", "0"])):
                runs[mode] = r = _serve(ckpt.path, device, flags, prompts, f"{family}-{mode}")
                st = r["stats"]
                made = sum(len(t) for t in r["tokens"])
                rep.say(f"engine {family} {mode}: started in {r['start_s']:.1f} s, kernel ops triton "
                        f"{st.get('kernel_triton_ops', '?')} / twin {st.get('kernel_twin_ops', '?')}, decode graphs "
                        f"{st.get('cuda_graphs', '?')}, pool {st.get('kv_pool_tokens', '?')} tokens; burst of "
                        f"{len(prompts)}: {made / r['burst_s']:.0f} tokens/s; repeat cached {r['again_cached']}; "
                        f"Triton compiles while serving {r['compiled'] if r['compiled'] is not None else 'n/a'}")
                compiles_total += r["compiled"] or 0
                if r["bad"]:
                    rep.fail(f"engine {family} {mode}: requests without a finish: {r['bad']}")
                if device == "cuda" and st.get("kernel_twin_ops", 0):
                    rep.fail(f"engine {family} {mode}: {st['kernel_twin_ops']} ops on their torch twins")
                if r["again_cached"] <= 0 or r["again_tokens"] != r["tokens"][0]:
                    rep.fail(f"engine {family} {mode}: the repeated prompt did not resume with the same tokens")
            if device == "cuda" and not runs["graphs"]["stats"].get("cuda_graphs"):
                rep.fail(f"engine {family}: no decode graph was captured")
            same = runs["graphs"]["tokens"] == runs["eager"]["tokens"]
            same_all &= same
            rep.say(f"engine {family}: greedy tokens with and without graphs "
                    f"{'identical' if same else 'DIFFER'}")
            if not same:
                rep.fail(f"engine {family}: graph replay changed greedy tokens")
    head["engine_graphs_identical"] = str(int(same_all))
    head["engine_compiles_while_serving"] = str(compiles_total)
