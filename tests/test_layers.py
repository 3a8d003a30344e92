"""The layering contracts in pyproject's ``[tool.importlinter]``, checked on every run of the suite.

launcher -> (engine | gateway | tierd, each alone) -> shared, kernels; a new
arrow back up (shared importing a process, one process importing another,
the launcher reaching into a process) fails here with the offending line.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept(tmp_path):
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 5
    assert f"Contracts: {len(contracts)} kept, 0 broken." in proc.stdout, proc.stdout
