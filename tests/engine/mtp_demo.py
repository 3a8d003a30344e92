"""The demo model with a multi-token-prediction head fitted to its own greedy outputs (seconds, on a CPU).

Used by the end-to-end speculative-decoding test and ``bench/drafter.py``:
a copy of the demo checkpoint, the greedy continuations of a few prompts
(in process, plain decode), a head fitted to them (sampled softmax: the
demo's vocabulary is too wide to score whole), written as ``mtp.*``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ignis.shared.demo import ensure_demo_model
from tests.engine.checkpoints import write_mtp
from tests.engine.mtp_fit import fit_head
from tests.engine.spec_driver import generate, load


def demo_prompts(n: int = 8, length: int = 24, seed: int = 5, vocab: int = 5000) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab, (length + 3 * i,), generator=gen).tolist() for i in range(n)]


def demo_with_head(out: Path, prompts: list[list[int]], max_tokens: int = 48, steps: int = 150,
                   negatives: int = 4096) -> Path:
    """``out``: a copy of the demo checkpoint whose head is fitted to its greedy outputs on ``prompts``."""
    src = Path(ensure_demo_model())
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    model, _ = load(out)
    outs, _ = generate(model, None, prompts, k=0, max_tokens=max_tokens, lanes=len(prompts),
                       pages=2 * len(prompts) + 2, prefill_budget=512, sampling={"temperature": 0.0,
                                                                                 "ignore_eos": True})
    text = json.loads((out / "config.json").read_text())
    seqs = [(p + outs[f"r{i}"], len(p)) for i, p in enumerate(prompts)]
    head = fit_head(model, "qwen3_5", text, seqs, steps=steps, negatives=negatives)
    write_mtp(out, head.checkpoint_tensors(0), "qwen3_5", torch.float32)
    return out
