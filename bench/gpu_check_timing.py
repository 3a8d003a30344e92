"""gpu_check's timing harness: CUDA-event medians, table rows against the H200's ceilings, twin checks.

A case is timed after warm-up as the median of several runs; its row gives
GB/s and TFLOP/s against about 4.3 TB/s HBM and 790 TFLOP/s dense bf16. Small
cases can sit in the 50 MB L2, so their GB/s can exceed what HBM gives. The
first case of each op is also checked against its torch twin (``rel_rms``).
Past the deadline cases are skipped and counted.

Imported by ``bench/gpu_check.py`` once it has set ``TRITON_INTERPRET`` and called ``use_checkout()``.
"""

from __future__ import annotations

import statistics
import time

import torch

from gpu_check_report import Report
from gpu_check_shapes import PAGE, Shapes

HBM_GBPS = 4300.0
MMA_TFLOPS = 790.0


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))


class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"
        # the interpreter compiles nothing, so a dry run's one timed call needs no warm-up
        self.warmup, self.iters = (3, 10) if self.cuda else (0, 1)

    def __call__(self, fn) -> float:
        """Median milliseconds of one call of ``fn``."""
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if sum(times) > 2000 and len(times) >= 3:
                break
        return statistics.median(times)


class Bench:
    """Times cases into table rows; checks the first case of each op against its twin."""

    def __init__(self, rep: Report, shapes: Shapes, device: str, deadline: float):
        self.rep, self.s, self.dev, self.deadline = rep, shapes, device, deadline
        self.timer = Timer(device)
        self.gen = torch.Generator(device=device).manual_seed(0)
        self.checked: set[str] = set()
        self.skipped = 0
        rep.say(f"{'op':<18} {'case':<24} {'ms':>9} {'GB/s':>8} {'%HBM':>6} {'TFLOP/s':>8} {'%MMA':>6}  check")

    def randn(self, *shape, dtype=torch.bfloat16, scale=1.0):
        t = torch.randn(shape, generator=self.gen, device=self.dev, dtype=dtype)
        return t.mul_(scale) if scale != 1.0 else t

    def case(self, op: str, name: str, fn, nbytes: float, flops: float, check=None, tol: float = 2e-2):
        if time.monotonic() > self.deadline:
            self.skipped += 1
            return None
        note = ""
        if check is not None and op not in self.checked:
            self.checked.add(op)
            got, want = check()
            err = rel_rms(got, want)
            note = f"rel_rms {err:.1e} {'ok' if err < tol else 'FAIL'}"
            if not err < tol:
                self.rep.failures.append(f"bench check {op} {name}")
        ms = self.timer(fn)
        gbps, tflops = nbytes / ms / 1e6, flops / ms / 1e9
        self.rep.say(f"{op:<18} {name:<24} {ms:9.3f} {gbps:8.1f} {100 * gbps / HBM_GBPS:5.1f}% "
                     f"{tflops:8.2f} {100 * tflops / MMA_TFLOPS:5.1f}%  {note}")
        return ms, gbps, tflops


def page_tables(b: Bench, num_pages: int, bsz: int, ctx: int) -> torch.Tensor:
    per = (ctx + PAGE - 1) // PAGE
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(bsz * 7 + ctx))[: bsz * per]
    return perm.view(bsz, per).to(device=b.dev, dtype=torch.int32)
