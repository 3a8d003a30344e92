"""bench/templates.py in its quick mode: the BENCH line, and a cached mark far cheaper than a first one."""

from __future__ import annotations

import pytest

from tests.bench.test_benchmarks_quick import run_quick
from tests.support.real_tokenizer import TEMPLATE_FILES


def test_templates_quick_mode_prints_bench_line():
    if not TEMPLATE_FILES["qwen3_5"].is_file():  # the bench renders the official template, read beside the checkout
        pytest.skip(f"{TEMPLATE_FILES['qwen3_5']} is absent")
    last = run_quick("templates.py").strip().splitlines()[-1]
    assert last.startswith("BENCH templates "), last
    fields = dict(kv.split("=") for kv in last.split()[2:])
    first, cached = float(fields["mark_us_first"]), float(fields["mark_us_cached"])
    assert 0 < cached < first
