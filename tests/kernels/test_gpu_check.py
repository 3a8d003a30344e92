"""bench/gpu_check.py's dry run (CPU, Triton interpreter, tiny shapes) exits 0 with its BENCH line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_passes_and_prints_its_bench_line(tmp_path):
    out = tmp_path / "gpu_check.txt"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=dict(env, PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH gpu_check "), last
    fields = dict(kv.split("=", 1) for kv in last.split()[2:])
    assert int(fields["kernels_passed"]) > 0 and fields["kernels_failed"] == "0"
    assert float(fields["model_max_rel_err"]) < 5e-2
    table = out.read_text()
    for op in ("write_kv", "decode_attention", "prefill_attention", "gdn_chunk", "gdn_recurrent",
               "conv_varlen", "conv_update"):
        assert op in table, f"{op} missing from the table"
