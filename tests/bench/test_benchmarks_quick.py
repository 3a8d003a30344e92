"""Every benchmark runs in its quick mode, so none of them can rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, *args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("script,name,keys", [
    ("forward.py", "forward", ("prefill_ratio", "decode1_ratio", "decode16_ratio")),
    ("serve_throughput.py", "serve_throughput", ("ratio_1", "ratio_8", "ratio_32", "round_vs_forward_32")),
    ("round_cost.py", "round_cost", ("round_ms", "forward_ms", "round_vs_forward")),
    ("decode_fusion.py", "decode_fusion", ("ms_unfused", "ms_fused")),
    ("tiers.py", "tiers", ("ram_vs_memcpy", "disk_write_vs_raw", "disk_read_vs_raw", "ram_ttft_vs_cold",
                           "disk_ttft_vs_cold")),
    ("kv_format.py", "kv_format", ("bytes_ratio", "attn_time_ratio")),
    ("reuse.py", "reuse", ("warm_cold_1k", "warm_cold_8k", "warm_cold_32k", "short_tax", "burst_prefill_ratio",
                                "cold_burst_prefill_ratio", "cold_burst_identical", "warm32k_vs_short",
                                "preamble_burst_prefill_ratio", "preamble_burst_identical", "cold_burst_optimum")),
    ("lm_head.py", "lm_head", ("head_ms", "sample_default_ms", "sample_recommended_ms", "head_sampler_share")),
    ("agent_replay.py", "agent_replay", ("cached_vs_ideal", "warm_ttft_vs_cold", "outputs_equal", "short_tax")),
    ("grammar_tax.py", "grammar_tax", ("free_ms", "constrained_ms", "fill_ms", "apply_ms", "grammar_tax_4")),
    ("drafter.py", "drafter", ("speedup_k2_1", "speedup_k2_8", "accept_k2", "outputs_equal")),
    ("ngram_drafter.py", "ngram_drafter", ("speedup_loop_1", "speedup_loop_8", "accept_loop", "demo_ratio_1",
                                           "outputs_equal")),
    ("images.py", "images", ("encode_ms_256", "encode_ms_512", "encode_ms_768", "cache_hit_ratio",
                             "warm_cold_image_turn")),
    ("loop_costs.py", "loop_costs", ("head_wait_ms", "head_wait_base_ms", "lower_match_ms", "rep_penalty_ms",
                                     "stats_ms")),
])
def test_quick_mode_prints_bench_line(script, name, keys, real_checkpoint):
    # agent_replay serves the session's real-tokenizer checkpoint instead of building its own
    args = ["--model", str(real_checkpoint("qwen3_5").path)] if script == "agent_replay.py" else []
    last = run_quick(script, *args).strip().splitlines()[-1]
    assert last.startswith(f"BENCH {name} "), last
    fields = dict(kv.split("=") for kv in last.split()[2:])
    for key in keys:
        assert float(fields[key]) > 0, last


def test_gpu_tiers_dry_run_moves_the_entry_across_processes():
    out = run_quick("gpu_tiers.py")
    last = out.strip().splitlines()[-1]
    assert last.startswith("BENCH gpu_tiers ok=1 "), out
    assert "hash_ok  True" in out and "scatter_ok  True" in out
    fields = dict(kv.split("=") for kv in last.split()[2:])
    assert float(fields["gather_gbps"]) > 0 and float(fields["scatter_gbps"]) > 0


def test_abuse_quick_meets_its_goals():
    last = run_quick("abuse.py").strip().splitlines()[-1]
    assert last.startswith("BENCH abuse "), last
    f = {k: float(v) for k, v in (kv.split("=") for kv in last.split()[2:])}
    assert set(f) == {"big_body_s", "health_max_ms", "rss_growth_mb", "halfsent_closed_s", "engine_alive",
                      "wrong_answers"}
    assert f["big_body_s"] <= 1 and f["health_max_ms"] <= 100 and f["rss_growth_mb"] <= 200, last
    assert f["halfsent_closed_s"] <= 30 and f["engine_alive"] == 1 and f["wrong_answers"] == 0, last


def test_soak_quick_loses_nothing_and_leaks_nothing():
    last = run_quick("soak.py").strip().splitlines()[-1]
    assert last.startswith("BENCH soak "), last
    f = dict(kv.split("=") for kv in last.split()[2:])
    assert int(f["requests"]) > 20 and int(f["disconnects"]) > 0, last
    assert f["errors_5xx"] == "0" and f["failed"] == "0" and f["alive"] == "1" and f["idle"] == "1", last
    assert f["leaked_pages"] == "0" and f["leaked_slots"] == "0", last
    assert int(f["hits_device"]) + int(f["hits_kv_ram"]) + int(f["hits_kv_disk"]) > 0, last


def test_agent_replay_refuses_timed_on_a_trace_without_times_before_starting_anything():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_replay.py"), "--timed"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--timed:" in proc.stderr and "records no time" in proc.stderr
    assert "Traceback" not in proc.stderr and "serve" not in proc.stdout
