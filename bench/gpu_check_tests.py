"""gpu_check's ``tests`` section (``--with-tests``): pytest on ``tests/kernels`` on the device, passed / failed counts from its report.

On CUDA the kernels are compiled (no interpreter); the dry run exercises this
runner on a few fast tests. Past its budget pytest is stopped and the verdicts
printed so far are counted, with one failure for the overrun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from checkout import ROOT
from gpu_check_report import Report


def run_tests(rep: Report, device: str, budget: float) -> tuple[int, int]:
    if not _has("pytest"):
        rep.say("tests: skipped (pytest is not installed here)")
        return 0, 0
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/kernels",
           "--ignore=tests/kernels/test_gpu_check.py", "-o", "addopts="]
    env = dict(os.environ, IGNIS_TEST_DEVICE=device)
    if device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    else:  # the dry run exercises the runner on a few fast tests
        cmd += ["-k", "write_kv or selects or bad_env or split_plan"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget)
        out, timed_out = proc.stdout, False
    except subprocess.TimeoutExpired as exc:  # keep the verdicts printed so far
        raw = exc.stdout or b""
        out, timed_out = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw), True
    verdicts = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", out, re.MULTILINE)
    passed = sum(v in ("PASSED", "XFAIL") for _, v in verdicts)
    skipped = sum(v == "SKIPPED" for _, v in verdicts)
    bad = [name for name, v in verdicts if v in ("FAILED", "ERROR", "XPASS")]
    for name in bad:
        rep.fail(f"test {name}")
    failed = len(bad)
    if timed_out:
        rep.fail(f"tests: pytest ran past its {budget:.0f} s budget; counts are of the tests finished by then")
        failed += 1
    elif not verdicts:
        rep.fail(f"tests: pytest reported no tests (rc {proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}")
        failed += 1
    rep.say(f"tests: {passed} passed, {failed} failed, {skipped} skipped ({time.monotonic() - t0:.0f} s)")
    return passed, failed


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None
