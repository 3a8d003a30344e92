"""bench/gateway_overhead.py in its quick mode prints its BENCH line, every figure positive."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gateway_overhead_quick():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gateway_overhead.py"), "--quick"], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH gateway_overhead "), last
    fields = dict(kv.split("=") for kv in last.split()[2:])
    assert set(fields) == {"us_per_token_1", "us_per_token_64", "tokens_per_s_64", "ratio_to_raw_64",
                           "tokens_per_s_256", "chat_us_per_token", "responses_us_per_token", "responses_to_chat"}
    for value in fields.values():
        assert float(value) > 0  # CPU time per token and throughputs: positive by construction
