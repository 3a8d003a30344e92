"""Decode step of a random-weight Qwen3.5-27B on the GPU: fused ops against their torch twins.

Two backends over the same model and state: ``triton`` (every Triton form,
the fused norms and gates of kernels/fused included) and ``unfused`` (the
same, but each fused op replaced by its torch twin: the chains the model ran
before the fusions). For each: CUDA kernels one step launches (torch
profiler), the step's median wall time over ``--steps`` eager steps (no CUDA
graphs), and the logits' ``max|a - b| / max|b|`` between the two.

    python bench/decode_fusion.py [--seqs 4] [--layers 64] [--steps 20] [--device cuda] [--quick]

``--quick`` (the test suite's) runs a tiny model of the same structure on the
CPU under ``TRITON_INTERPRET=1`` with one warm-up step, not three: it checks
that the script runs, nothing more. Last line: ``BENCH decode_fusion kernels_unfused=A kernels_fused=B
ms_unfused=C ms_fused=D max_rel_err=E`` (kernels -1 off CUDA).

On an H200 (4 sequences, 64 layers, bf16): unfused 4005 kernels, median
57.0 ms per step; triton 1245 kernels, 43.0 ms; logits max rel err 5.7e-2
between the two (random weights, 64 bf16 layers: rounding compounds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

if "--quick" in sys.argv:  # before triton is imported: the kernels are decorated for the interpreter
    os.environ["TRITON_INTERPRET"] = "1"

import torch

from checkout import use_checkout

FUSED = ("rms_norm", "add_rms_norm", "gated_rms_norm", "norm_rotary", "silu_mul", "sigmoid_mul", "gdn_gating")


TINY = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 64, "linear_value_head_dim": 64}


def build(layers: int, device: str, tiny: bool = False):
    from ignis.engine.models.checkpoint_shapes import QWEN35_27B
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.hybrid import HybridModel

    cfg = config_from_dict({**QWEN35_27B, **(TINY if tiny else {}), "num_hidden_layers": layers})
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = HybridModel(cfg)
    torch.set_default_dtype(torch.float32)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
                p.fill_(1.0)
            elif name.endswith("A_log"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.rotary.inv_freq = model.rotary.frequencies(device)
    return model.eval()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def kernels_per_step(step, device: str) -> int:
    from torch.profiler import ProfilerActivity, profile

    if device != "cuda":
        return -1
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU (the test suite's run)")
    args = ap.parse_args()
    if args.quick:
        args.device, args.layers, args.steps, args.seqs = "cpu", 4, 1, 2
    use_checkout()
    from ignis.engine.forward_batch import ForwardBatch, SeqChunk
    from ignis.engine.models.state import ModelState
    from ignis.kernels.backend import REFERENCE, triton_ops

    dev = args.device
    model = build(args.layers, dev, tiny=args.quick)
    fused = triton_ops()
    unfused = dataclasses.replace(fused, name="unfused", **{op: getattr(REFERENCE, op) for op in FUSED})
    state = ModelState.allocate(model.cfg, num_pages=2 * args.seqs, lanes=args.seqs, dtype=torch.bfloat16,
                                device=dev)
    batch = ForwardBatch.build([SeqChunk([7 + b], 100 + b, [2 * b, 2 * b + 1], b) for b in range(args.seqs)],
                               dev)
    logits = {}
    for ops in (unfused, fused):
        model.ops = ops
        saved = (state.ssm.clone(), state.conv.clone())
        logits[ops.name] = model(batch, state).float()
        state.ssm.copy_(saved[0])
        state.conv.copy_(saved[1])
    err = float((logits["triton"] - logits["unfused"]).abs().max() / logits["unfused"].abs().max())
    print(f"logits triton vs unfused: max rel err {err:.2e} (finite: {bool(logits['triton'].isfinite().all())})")
    figures = {}
    for ops in (unfused, fused):
        model.ops = ops

        def step():
            model(batch, state)

        for _ in range(1 if args.quick else 3):  # warm-up steps (one to run the path under the interpreter)
            step()
        sync(dev)
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            sync(dev)
            times.append(time.perf_counter() - t0)
        launches = kernels_per_step(step, dev)
        figures[ops.name] = (launches, statistics.median(times) * 1e3)
        print(f"{ops.name:8s}: {launches} CUDA kernels per decode step, median {statistics.median(times) * 1e3:.2f} ms "
              f"(min {min(times) * 1e3:.2f}) over {args.steps} eager steps, {args.seqs} seqs, {args.layers} layers")
    (k_u, ms_u), (k_f, ms_f) = figures["unfused"], figures["triton"]
    print(f"BENCH decode_fusion kernels_unfused={k_u} kernels_fused={k_f} ms_unfused={ms_u:.2f} ms_fused={ms_f:.2f} "
          f"max_rel_err={err:.2e}")


if __name__ == "__main__":
    main()
