"""The GPU run in one call: is ignis right on this device, and how fast is a 27B-shaped model?

Sections, each in its own process (a crash or a hang in one costs only its
own lines) with its own time budget; the whole run keeps inside six minutes
and a section past its deadline skips what is left and says so:

1. ``e2e``: a Qwen3.5-27B-shaped model with random weights made on the
   device: the memory plan (weights, KV pool tokens in bf16 and hq-e8-2b),
   prefill tokens/s at 8K and 32K, decode TPOT at 1 and 32 lanes eager and
   with CUDA graphs (``gpu_check_e2e``).
2. ``state``: a state image cloned into a device slot, restored from a host
   slot (``gpu_check_e2e``).
3. ``kernels``: each Triton form at 27B shapes (paged attention, GDN chunk and
   recurrent, causal conv; then the hq-e8-2b forms), checked against its torch
   twin on its first case and timed against the H200's ceilings
   (``gpu_check_bench``).
4. ``model``: a small random Qwen3.5 on the Triton forms against the twins and
   against transformers' forward, bf16 and fp32 (``gpu_check_model``).
5. ``tiers``: ``bench/gpu_tiers.py``: the engine <-> tierd copy path across
   two processes through the pool's CUDA IPC handle (``gpu_check_tiers``).
6. ``engine``: the real engine process on small checkpoints of both families,
   with and without decode graphs: the kernel path, graphs captured, greedy
   tokens identical either way, a repeat resumed (``gpu_check_engine``).

``--with-tests`` adds pytest on ``tests/kernels`` on the device first
(``gpu_check_tests``; minutes, so not in the default run).

``--dry-run`` (alias ``--quick``) runs every section on the CPU under
``TRITON_INTERPRET=1`` at tiny shapes, so the script cannot rot; there the
sections share no device, so they run at once (one per CPU core, the slowest
first, each on one torch thread) and their lines are printed and written in
the usual order.
``--compile-only`` needs no GPU either: it compiles every kernel launch at 27B
shapes for sm_90 and checks its shared memory (``gpu_check_compile``).

The table goes to ``--out`` (default ``bench/out/gpu_check.txt``) and is
copied to ``$OUT`` when that is set. The last line:

    BENCH gpu prefill_8k_tok_s=A prefill_32k_tok_s=B tpot_1_ms=C tpot_32_ms=D clone_ms=E restore_gbs=F
        kernels_ok=G ...

(``kernels_ok`` is 1 when every kernel and model check passed; further
figures follow.) ``bench/gpu_check.sh`` runs it on a bare CUDA machine.

    python bench/gpu_check.py [--dry-run | --compile-only] [--with-tests] [--out PATH]
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
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

TOTAL_S = 360.0  # one device call
SECTIONS = {"tests": 150.0, "e2e": 120.0, "state": 20.0, "engine": 70.0, "kernels": 60.0, "model": 30.0,
            "tiers": 25.0}
HEAD_KEYS = ("prefill_8k_tok_s", "prefill_32k_tok_s", "tpot_1_ms", "tpot_32_ms", "clone_ms", "restore_gbs")
MORE_KEYS = ("engine_graphs_identical", "engine_compiles_while_serving", "tpot_1_eager_ms", "tpot_32_eager_ms",
             "model_max_rel_err", "decode_attn_64k_gbps",
             "prefill_attn_tflops", "gdn_chunk_ms", "gdn_wy_ms", "gdn_recurrent_gbps", "conv_varlen_gbps", "hq_decode_b64_gbps",
             "hq_prefill_tflops", "tiers_ok", "tiers_gather_gbps", "tiers_scatter_gbps")
RESULT = "GPU_CHECK_RESULT "  # a section's last line: its figures and failures as JSON
DRY_SLOWEST_FIRST = ("kernels", "model", "engine", "e2e", "tiers", "state", "tests")  # dry-run seconds, most first
PRINTING = threading.Lock()  # one section's lines at a time when dry-run sections finish together


def run_section(name: str, device: str, seconds: float) -> int:
    """In the section's own process: run it, print its lines, end with the RESULT line."""
    import torch

    from gpu_check_report import Report
    from gpu_check_shapes import DRY, FULL

    shapes = DRY if device == "cpu" else FULL
    if device == "cpu":  # the dry run's sections run at once, one per core: a thread each, none waiting
        torch.set_num_threads(1)
    rep = Report()
    head: dict[str, str] = {}
    deadline = time.monotonic() + seconds
    try:
        if os.environ.get("IGNIS_GPU_CHECK_FAIL") == name:  # the tests' way to see one section fail alone
            raise RuntimeError("failing on purpose (IGNIS_GPU_CHECK_FAIL)")
        if name == "tests":
            from gpu_check_tests import run_tests

            passed, failed = run_tests(rep, device, seconds)
            head["kernel_tests"] = f"{passed}/{passed + failed}"
        elif name == "e2e":
            from gpu_check_e2e import run_e2e

            run_e2e(rep, shapes, device, deadline, head)
        elif name == "state":
            from gpu_check_e2e import run_state

            run_state(rep, shapes, device, deadline, head)
        elif name == "kernels":
            from gpu_check_bench import run_bench

            run_bench(rep, shapes, device, deadline, head)
        elif name == "model":
            from gpu_check_model import run_model

            head["model_max_rel_err"] = f"{run_model(rep, shapes, device, deadline):.2e}"
        elif name == "engine":
            from gpu_check_engine import run_engine

            run_engine(rep, shapes, device, deadline, head)
        elif name == "tiers":
            from gpu_check_tiers import run_tiers

            run_tiers(rep, device, head, seconds)
    except Exception as exc:  # the section's failure, with what it printed so far
        import traceback

        traceback.print_exc()
        rep.fail(f"{name}: {type(exc).__name__}: {exc}")
    if device == "cuda" and torch.cuda.is_available():
        head[f"{name}_peak_gib"] = f"{torch.cuda.max_memory_allocated() / 2**30:.1f}"
    print(RESULT + json.dumps({"head": head, "failures": rep.failures}), flush=True)
    return 0


def spawn(name: str, device: str, seconds: float, dry: bool, lines: list[str]) -> tuple[dict, list[str]]:
    """Run one section in a child; its figures and failures (a crash or a hang is a failure)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--seconds", f"{seconds:.0f}"]
    argv += ["--dry-run"] if dry else []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result: dict = {"head": {}, "failures": []}
    got_result = False
    try:
        # the child checks its own deadline between steps; the margin covers imports and a step in flight
        out, _ = proc.communicate(timeout=seconds + 45)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        result["failures"].append(f"{name}: still running after {seconds + 45:.0f} s, killed")
    with PRINTING:
        for line in out.splitlines():
            if line.startswith(RESULT):
                got = json.loads(line[len(RESULT):])
                result = {"head": got["head"], "failures": got["failures"] + result["failures"]}
                got_result = True
            else:
                print(line, flush=True)
                lines.append(line)
        if not got_result and proc.returncode not in (0, None):
            result["failures"].append(f"{name}: exited {proc.returncode} without a result")
        lines.append(f"section {name}: {time.monotonic() - t0:.0f} s, {len(result['failures'])} failures")
        print(lines[-1], flush=True)
    return result["head"], result["failures"]


def spawn_at_once(sections: list[str], device: str, lines: list[str]) -> list[tuple[dict, list[str]]]:
    """Dry run: every section in its own child at once, one per CPU core, the slowest first; results in order."""
    own: dict[str, list[str]] = {s: [] for s in sections}
    # sharing the cores stretches each section, so each gets the whole run's budget: no case is skipped
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        started = {s: pool.submit(spawn, s, device, TOTAL_S - 45, True, own[s])
                   for s in sorted(sections, key=DRY_SLOWEST_FIRST.index)}
        got = [started[s].result() for s in sections]
    for s in sections:
        lines += own[s]
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", "--quick", action="store_true", dest="dry_run",
                        help="CPU, TRITON_INTERPRET=1, tiny shapes (checks the script itself)")
    parser.add_argument("--compile-only", action="store_true",
                        help="no GPU needed: compile every kernel launch for sm_90 and check its shared memory")
    parser.add_argument("--with-tests", action="store_true", help="run pytest on tests/kernels on the device first")
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu_check.txt",
                        help="where the table is written")
    parser.add_argument("--section", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if args.section:
        return run_section(args.section, device, args.seconds)
    t0 = time.monotonic()
    if args.compile_only:
        from gpu_check_compile import run_compile_only
        from gpu_check_report import Report

        rep = Report()
        ok = run_compile_only(rep)
        print(f"BENCH gpu_compile compiled={ok} compile_failed={len(rep.failures)} "
              f"wall_s={time.monotonic() - t0:.0f}", flush=True)
        return 0 if not rep.failures else 1
    import torch
    import triton

    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU machine)", file=sys.stderr)
        return 2
    lines: list[str] = []
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    lines.append(f"gpu_check on {name}: torch {torch.__version__}, triton {triton.__version__}, "
                 f"python {sys.version.split()[0]}")
    print(lines[-1], flush=True)
    sections = [s for s in SECTIONS if s != "tests" or args.with_tests]
    if args.only:
        sections = [s for s in sections if s in args.only.split(",")]
    head: dict[str, str] = {}
    failures: list[str] = []
    checks_ran = checks_failed = 0  # kernels, model and tests: the correctness sections
    at_once = spawn_at_once(sections, device, lines) if args.dry_run else None
    for i, section in enumerate(sections):
        if at_once is not None:
            got, failed = at_once[i]
        else:
            left = TOTAL_S - (time.monotonic() - t0) - 10 * (len(sections) - i - 1)
            seconds = min(SECTIONS[section], left - 45)
            if seconds < 5:
                lines.append(f"section {section}: skipped, {left:.0f} s left of the {TOTAL_S:.0f} s run")
                print(lines[-1], flush=True)
                continue
            got, failed = spawn(section, device, seconds, args.dry_run, lines)
        head.update(got)
        failures += [f if f.startswith(section) else f"{section}: {f}" for f in failed]
        if section in ("kernels", "model", "tests", "engine"):
            checks_ran += 1
            checks_failed += len(failed)
    wall = time.monotonic() - t0
    for f in failures:
        lines.append(f"FAIL {f}")
        print(lines[-1], flush=True)
    lines.append(f"failures: {len(failures)}; wall {wall:.0f} s")
    print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    if os.environ.get("OUT"):
        shutil.copy(args.out, Path(os.environ["OUT"]) / args.out.name)
    kernels_ok = int(checks_ran > 0 and checks_failed == 0)
    fields = [f"{k}={head.get(k, 'nan')}" for k in HEAD_KEYS] + [f"kernels_ok={kernels_ok}"]
    fields += [f"{k}={head[k]}" for k in MORE_KEYS if k in head]
    fields += [f"failures={len(failures)}", f"wall_s={wall:.0f}"]
    print("BENCH gpu " + " ".join(fields), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
