"""bench/external_load.sh --quick: aiperf and guidellm, each in its own venv, against ignis serve on the demo model.

Long mode only (``IGNIS_LONG_TESTS=1``): the first run installs both tools into
``$IGNIS_BENCH_VENVS`` (default ``~/.cache/ignis-bench``), and each tool takes
about a minute to start and run its 6 requests on a small CPU box.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.long,
              pytest.mark.skipif(os.environ.get("IGNIS_LONG_TESTS") != "1",
                                 reason="long mode: IGNIS_LONG_TESTS=1 (installs aiperf and guidellm)")]


def test_both_tools_run_the_shared_prefix_load_without_errors(tmp_path):
    env = dict(os.environ, IGNIS_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "external_load.sh"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH external_load "), last
    f = {k: float(v) for k, v in (kv.split("=") for kv in last.split()[2:])}
    for tool in ("aiperf", "guidellm"):
        assert f[f"{tool}_ok"] == 6 and f[f"{tool}_errors"] == 0, last
        assert 0 < f[f"{tool}_ttft_p50_ms"] <= f[f"{tool}_ttft_p99_ms"], last
        assert f[f"{tool}_itl_p50_ms"] > 0 and f[f"{tool}_out_tok_s"] > 0, last
        assert f[f"{tool}_cached_pct"] > 0, last  # the shared prefixes were reused
    assert f["guidellm_tpot_p50_ms"] > 0
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
