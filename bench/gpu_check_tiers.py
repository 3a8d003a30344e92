"""gpu_check section tiers: ``bench/gpu_tiers.py``, the engine <-> tierd copy path, in its own processes.

Its lines go into the table and its figures into ``head``; anything but a last
line ``BENCH gpu_tiers ok=1 ...`` with exit 0 is a failure.
"""

from __future__ import annotations

import subprocess
import sys

from checkout import ROOT
from gpu_check_report import Report


def run_tiers(rep: Report, device: str, head: dict, seconds: float) -> None:
    """bench/gpu_tiers.py in its own processes, its figures into the table and ``head``."""
    argv = [sys.executable, str(ROOT / "bench" / "gpu_tiers.py")] + (["--dry-run"] if device == "cpu" else [])
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        rep.fail(f"tiers: bench/gpu_tiers.py ran past {seconds:.0f} s")
        return
    lines = proc.stdout.strip().splitlines()
    for line in lines:
        rep.say(f"tiers: {line}")
    last = lines[-1] if lines else ""
    if proc.returncode != 0 or not last.startswith("BENCH gpu_tiers ok=1 "):
        rep.fail(f"tiers: exit {proc.returncode}: {proc.stderr[-1500:]}")
    fields = dict(kv.split("=", 1) for kv in last.split()[2:] if "=" in kv)
    head["tiers_ok"] = fields.get("ok", "0")
    for key in ("gather_gbps", "scatter_gbps"):
        if key in fields:
            head[f"tiers_{key}"] = fields[key]
