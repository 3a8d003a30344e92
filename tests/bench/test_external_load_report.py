"""bench/external_load_report.py on exported JSON recorded from aiperf 0.13.0 and guidellm 0.8.1 (trimmed).

The samples in external_load_samples/ came from a quick run of bench/external_load.sh against the
demo model: 6 requests each, no errors.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "external_load_samples"
sys.path.insert(0, str(ROOT / "bench"))

import external_load_report as report  # noqa: E402


def sample(name: str) -> dict:
    return json.loads((SAMPLES / name).read_text())


def test_aiperf_export_gives_its_percentiles_throughput_and_counts():
    r = report.parse_aiperf(sample("profile_export_aiperf.json"))
    assert (r.ttft_p50_ms, r.ttft_p99_ms) == pytest.approx((242.119, 514.678), abs=1e-3)
    assert r.itl_p50_ms == pytest.approx(44.639, abs=1e-3)
    assert r.tpot_p50_ms is None
    assert r.out_tok_s == pytest.approx(28.510, abs=1e-3)
    assert r.cached_pct == pytest.approx(512 / 1776 * 100)
    assert (r.ok, r.errors) == (6, 0)


def test_guidellm_export_gives_its_percentiles_throughput_and_counts():
    r = report.parse_guidellm(sample("benchmarks.json"))
    assert (r.ttft_p50_ms, r.ttft_p99_ms) == pytest.approx((134.934, 375.122), abs=1e-3)
    assert (r.itl_p50_ms, r.tpot_p50_ms) == pytest.approx((35.690, 41.892), abs=1e-3)
    assert r.out_tok_s == pytest.approx(40.567, abs=1e-3)
    assert r.cached_pct == pytest.approx(4 * 256 / (6 * 301) * 100)  # the first use of each of the 2 prefixes missed
    assert (r.ok, r.errors) == (6, 0)


def test_errors_count_from_either_tool():
    a = sample("profile_export_aiperf.json")
    a["error_request_count"] = {"unit": "requests", "avg": 2.0}
    a["error_summary"] = [{"error_details": {"code": 400, "message": "bad"}, "count": 2}]
    assert report.parse_aiperf(a).errors == 2
    a["was_cancelled"] = True
    assert report.parse_aiperf(a).errors == 3
    g = sample("benchmarks.json")
    g["benchmarks"][0]["metrics"]["request_totals"].update(errored=1, incomplete=2)
    assert report.parse_guidellm(g).errors == 3


def test_a_file_missing_a_metric_names_it():
    a = sample("profile_export_aiperf.json")
    del a["inter_token_latency"]
    with pytest.raises(report.ReportError, match="inter_token_latency.p50"):
        report.parse_aiperf(a)
    g = sample("benchmarks.json")
    g["benchmarks"].append(copy.deepcopy(g["benchmarks"][0]))
    with pytest.raises(report.ReportError, match="exactly one benchmark, found 2"):
        report.parse_guidellm(g)


def test_main_prints_the_table_then_the_bench_line_and_fails_on_errors(tmp_path, capsys):
    args = ["--aiperf", str(SAMPLES / "profile_export_aiperf.json"), "--guidellm", str(SAMPLES / "benchmarks.json")]
    assert report.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["tool", "TTFT", "p50"]
    assert [line.split()[0] for line in lines[1:3]] == ["aiperf", "guidellm"]
    assert lines[-1] == ("BENCH external_load aiperf_ttft_p50_ms=242.1 aiperf_ttft_p99_ms=514.7 aiperf_itl_p50_ms=44.6 "
                         "aiperf_out_tok_s=28.5 aiperf_cached_pct=28.8 aiperf_ok=6 aiperf_errors=0 guidellm_ttft_p50_ms=134.9 "
                         "guidellm_ttft_p99_ms=375.1 guidellm_itl_p50_ms=35.7 guidellm_tpot_p50_ms=41.9 "
                         "guidellm_out_tok_s=40.6 guidellm_cached_pct=56.7 guidellm_ok=6 guidellm_errors=0")
    g = sample("benchmarks.json")
    g["benchmarks"][0]["metrics"]["request_totals"]["errored"] = 1
    (tmp_path / "g.json").write_text(json.dumps(g))
    assert report.main(["--guidellm", str(tmp_path / "g.json")]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("guidellm_errors=1")
    (tmp_path / "bad.json").write_text("[]")
    assert report.main(["--aiperf", str(tmp_path / "bad.json")]) == 2
    assert "not a JSON object" in capsys.readouterr().err
