"""One GPU acceptance run of the Triton kernels: tests on the device, model equivalence, timings.

Sections, each with its own share of an 8-minute budget (a section past its
deadline skips its remaining cases and says so in the table):

1. tests: pytest on ``tests/kernels`` with ``IGNIS_TEST_DEVICE=cuda`` (kernels
   compiled, no interpreter); passed / failed counts from its verbose report
   (those finished by the deadline if it runs over).
2. model: a small random Qwen3.5 in bf16 (and fp32) on the GPU: HybridModel on
   the Triton forms against the same model on the torch twins over mixed
   decode + prefill batches, and, where transformers is importable, against
   transformers' forward (chunked prefill then decode steps against one full
   forward). Error is ``max|ours - ref| / max|ref|`` over the logits.
3. bench: each Triton form at Qwen3.5-27B shapes (24 q / 4 kv heads of 256;
   GDN 16 key / 48 value heads of 128; conv dim 10240), CUDA events, warm-up,
   median of several runs; achieved GB/s and TFLOP/s against the H200's
   ceilings (about 4.3 TB/s, 790 TFLOP/s dense bf16). The first case of each
   op is also checked against its twin. Small cases can sit in the 50 MB L2,
   so their GB/s can exceed what HBM gives.
4. hq: the hq-e8-2b forms (quantize-on-write, decode and prefill attention
   over compressed pages + a 64-token exact window) at the same shapes, with
   their own share of the budget; GB/s counts the compressed bytes read.
5. tiers: ``bench/gpu_tiers.py``, the engine <-> tierd copy path across two
   processes (CUDA IPC pool, pinned shared-memory slots, tierd's backend):
   bytes checked both ways, GB/s against torch's own device <-> pinned copy.

Each section is a module beside this driver: ``gpu_check_tests``,
``gpu_check_model``, ``gpu_check_bench`` (3 and 4, timed by
``gpu_check_timing``), ``gpu_check_tiers``; ``gpu_check_compile`` is the
compile-only run, ``gpu_check_shapes`` and ``gpu_check_report`` what they share.

``--dry-run`` (alias ``--quick``) runs the same code on the CPU under
``TRITON_INTERPRET=1`` with tiny shapes. ``--compile-only`` needs no GPU
either: it runs every wrapper on meta tensors at the 27B shapes (bf16) and
the largest test shapes (fp32), captures the launches instead of running
them, and compiles each for sm_90 the way the JIT would specialise it,
failing on any compile error or on shared memory above the H200's 227 KB.

The table goes to ``--out`` (default ``bench/out/gpu_check.txt``) and is
copied to ``$OUT`` when that is set. The last line is ``BENCH gpu_check kernels_passed=N kernels_failed=M
model_max_rel_err=X ...`` (headline figures come from each op's largest case).

    python bench/gpu_check.py [--dry-run | --compile-only] [--out PATH]
"""

from __future__ import annotations

import os
import sys

DRY_RUN = "--dry-run" in sys.argv or "--quick" in sys.argv
if DRY_RUN:  # before anything imports triton: kernels are decorated for the interpreter
    os.environ["TRITON_INTERPRET"] = "1"
elif "--compile-only" in sys.argv:  # compiling needs real JIT functions, not interpreted ones
    os.environ.pop("TRITON_INTERPRET", None)

import argparse  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

import torch  # noqa: E402

# The sections import torch (and, lazily, triton and ignis): only after the two steps above.
from gpu_check_bench import run_bench  # noqa: E402
from gpu_check_compile import run_compile_only  # noqa: E402
from gpu_check_model import run_model  # noqa: E402
from gpu_check_report import BUDGET_S, Report  # noqa: E402
from gpu_check_shapes import DRY, FULL  # noqa: E402
from gpu_check_tests import run_tests  # noqa: E402
from gpu_check_tiers import run_tiers  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", "--quick", action="store_true", dest="dry_run",
                        help="CPU, TRITON_INTERPRET=1, tiny shapes (checks the script itself)")
    parser.add_argument("--compile-only", action="store_true",
                        help="no GPU needed: compile every kernel launch for sm_90 and check its shared memory")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu_check.txt",
                        help="where the table is written")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.compile_only:
        rep = Report()
        ok = run_compile_only(rep)
        print(f"BENCH gpu_check compiled={ok} compile_failed={len(rep.failures)} "
              f"wall_s={time.monotonic() - t0:.0f}", flush=True)
        return 0 if not rep.failures else 1
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU machine)", file=sys.stderr)
        return 2
    shapes = DRY if args.dry_run else FULL
    rep = Report()
    import triton

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    rep.say(f"gpu_check on {name}: torch {torch.__version__}, triton {triton.__version__}")
    passed, failed = run_tests(rep, device, BUDGET_S["tests"])
    model_err = float("nan")
    try:
        model_err = run_model(rep, shapes, device, time.monotonic() + BUDGET_S["model"])
    except Exception as exc:
        rep.fail(f"model: {type(exc).__name__}: {exc}")
    head: dict[str, str] = {}
    run_bench(rep, shapes, device, time.monotonic() + BUDGET_S["bench"], head)
    run_tiers(rep, device, head)
    wall = time.monotonic() - t0
    rep.say(f"failures: {len(rep.failures)}; wall {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(rep.lines) + "\n")
    if os.environ.get("OUT"):
        shutil.copy(args.out, Path(os.environ["OUT"]) / args.out.name)
    fields = [f"kernels_passed={passed}", f"kernels_failed={failed}", f"model_max_rel_err={model_err:.2e}"]
    fields += [f"{k}={head[k]}" for k in ("decode_attn_64k_gbps", "decode_attn_b64_gbps", "prefill_attn_tflops",
                                          "gdn_chunk_ms", "gdn_recurrent_gbps", "conv_varlen_gbps",
                                          "hq_decode_b1_gbps", "hq_decode_b64_gbps", "hq_prefill_tflops",
                                          "tiers_ok", "tiers_gather_gbps", "tiers_scatter_gbps")
               if k in head]
    fields += [f"failures={len(rep.failures)}", f"wall_s={wall:.0f}"]
    print("BENCH gpu_check " + " ".join(fields), flush=True)
    return 0 if not rep.failures and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
