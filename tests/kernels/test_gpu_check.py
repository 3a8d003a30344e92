"""bench/gpu_check.py without a GPU: its dry run, and its sm_90 compile-only pre-flight.

The dry run (CPU, Triton interpreter, tiny shapes) runs every step of the
GPU plan and must exit 0 with its BENCH line and a table naming every op and
figure; a section that fails is reported while the others still run. The compile-only run compiles every kernel
launch the wrappers make at 27B shapes for sm_90, so code the interpreter
accepts but the compiler rejects (or that overflows shared memory) fails here.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(*args: str, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), *args], cwd=ROOT,
                          env=dict(env, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH gpu"), last
    return proc.stdout


def fields(stdout: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in stdout.strip().splitlines()[-1].split()[2:])


def test_dry_run_passes_and_prints_its_bench_line(tmp_path):
    out = tmp_path / "gpu_check.txt"
    stdout = run_script("--dry-run", "--out", str(out))
    assert stdout.strip().splitlines()[-1].startswith("BENCH gpu prefill_8k_tok_s=")
    got = fields(stdout)
    for key in ("prefill_8k_tok_s", "prefill_32k_tok_s", "tpot_1_ms", "tpot_32_ms", "clone_ms", "restore_gbs"):
        assert float(got[key]) > 0, f"{key}={got[key]}: every step of the plan ran"
    assert got["kernels_ok"] == "1" and got["failures"] == "0" and got["engine_graphs_identical"] == "1"
    assert got["engine_compiles_while_serving"] == "0"  # nothing compiles on the CPU; the key is there
    assert float(got["model_max_rel_err"]) < 5e-2
    assert got["tiers_ok"] == "1" and float(got["tiers_gather_gbps"]) > 0
    table = out.read_text()
    for op in ("write_kv", "decode_attention", "prefill_attention", "gdn_chunk", "gdn_recurrent",
               "conv_varlen", "conv_update", "hq_decode_attn", "memory plan bf16", "memory plan hq-e8-2b",
               "decode graphs", "restore from a host slot", "section tiers",
               "greedy tokens with and without graphs identical"):
        assert op in table, f"{op} missing from the table"


def test_a_section_that_fails_is_reported_and_the_others_still_run(tmp_path):
    out = tmp_path / "gpu_check.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET")}
    # IGNIS_GPU_CHECK_FAIL makes the state section raise: it fails alone
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--only", "state,tiers",
                           "--out", str(out)], cwd=ROOT, env=dict(env, IGNIS_GPU_CHECK_FAIL="state"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:]
    got = fields(proc.stdout)
    assert got["failures"] == "1" and got["tiers_ok"] == "1" and got["clone_ms"] == "nan"
    assert "FAIL state:" in out.read_text()


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None,
                    reason="this triton has no CUDA backend to compile with")
def test_every_kernel_compiles_for_sm90():
    out = run_script("--compile-only")
    got = fields(out)
    assert int(got["compiled"]) >= 9 and got["compile_failed"] == "0"
    for kernel in ("_rms_norm_kernel", "_gated_norm_kernel", "_norm_rotary_kernel", "_gate_mul_kernel",
                   "_gdn_gating_kernel"):  # the fused kernels every layer runs, in every graph
        assert f"compile {kernel} " in out
