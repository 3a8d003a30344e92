"""The engine's /metrics endpoint: parsed with prometheus_client, counters move with requests."""

from __future__ import annotations

import time
import urllib.request

import zmq

from prometheus_client.parser import text_string_to_metric_families

from ignis.engine.metrics import VLLM_OLD_NAMES
from tests.engine.engine_process import EngineProcess


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            values[key] = sample.value
    return values


def test_metrics_move_with_requests(tmp_path):
    eng = EngineProcess(tmp_path, "--kv-pool-tokens", "4096", "--decode-lanes", "4", "--metrics-port", "0",
                        "--metrics-compat", "vllm")
    try:
        port = None
        for line in eng.log_text().splitlines():
            if "metrics on http://" in line:
                port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert port, eng.log_text()
        before = scrape(port)
        assert before["ignis:num_requests_running"] == 0
        assert before["ignis:kv_pool_pages_free"] == 64
        assert before["ignis:kernel_path|path=reference"] == 1  # the CPU runs the twins
        assert before["ignis:kernel_path|path=triton"] == 0 and before["ignis:kernel_path|path=mixed"] == 0
        assert before["ignis:decode_cuda_graphs"] == 0  # no CUDA device: every decode round eager
        stats = eng.stats()
        assert stats["kernel_triton_ops"] == 0 and stats["kernel_fallback_ops"] == 0 and stats["kernel_twin_ops"] > 0
        p = list(range(10, 210))
        eng.run("m1", p, max_tokens=5, ignore_eos=True, opener_start=197)
        eng.run("m2", p, max_tokens=5, ignore_eos=True, opener_start=197)
        after = scrape(port)
        assert after["ignis:generation_tokens_total"] - before.get("ignis:generation_tokens_total", 0) == 10
        assert after["ignis:prompt_tokens_total"] - before.get("ignis:prompt_tokens_total", 0) == 400
        assert after["ignis:prefix_cache_queries_total"] == 400
        assert after["ignis:prefix_cache_hits_total"] == 197
        assert after["ignis:request_success_total|finished_reason=length"] == 2
        assert after["ignis:time_to_first_token_seconds_count"] == 2
        assert after["ignis:inter_token_latency_seconds_count"] == 8
        assert after["ignis:prefill_tokens_total"] == 200 + 3
        assert after["ignis:request_prompt_tokens_count"] == 2 and after["ignis:request_prompt_tokens_sum"] == 400
        assert after["ignis:request_generation_tokens_sum"] == 10
        for phase in ("prefill", "decode", "inference"):
            assert after[f"ignis:request_{phase}_time_seconds_count"] == 2
        assert after["ignis:request_inference_time_seconds_sum"] >= after["ignis:request_decode_time_seconds_sum"]
        assert after["ignis:reuse_hits_total|kind=prompt_checkpoint|tier=device"] == 1
        assert after["ignis:reuse_hit_tokens_total|kind=prompt_checkpoint|tier=device"] == 197
        assert after["ignis:reuse_captures_total"] == 1
        assert after["ignis:retained_entries"] == 1
        assert after["ignis:retained_device_bytes"] > 0
        twins = {k: v for k, v in after.items() if k.startswith("vllm:") and not k.split("|")[0].endswith("_created")}
        assert twins["vllm:prefix_cache_hits_total"] == 197
        assert twins["vllm:request_success_total|finished_reason=length"] == 2
        assert twins["vllm:time_to_first_token_seconds_count"] == 2
        older = {v: k for k, v in VLLM_OLD_NAMES.items()}
        for key, value in twins.items():  # --metrics-compat vllm: the same samples under vllm:
            short = key.split(":", 1)[1]
            for old, own in older.items():
                short = own + short[len(old):] if short.startswith(old) else short
            assert after["ignis:" + short] == value, key
        assert "vllm:reuse_hits_total|kind=prompt_checkpoint|tier=device" not in after  # no vLLM equivalent
        assert after["ignis:wire_errors_total|socket=gateway"] == 0
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(eng.endpoint)
        try:
            sock.send_multipart([b"not a message"])
            assert sock.poll(5000), "garbage is answered"
            sock.recv_multipart()
        finally:
            sock.close()
        deadline = time.monotonic() + 10  # folded into the counter by the loop turn after the reply
        while scrape(port)["ignis:wire_errors_total|socket=gateway"] < 1:
            assert time.monotonic() < deadline, "the gateway socket's malformed message was not counted"
            time.sleep(0.05)
    finally:
        assert eng.stop() == 0


def test_compiles_after_the_warm_up_are_exported_per_kernel_and_a_new_model_starts_at_zero():
    from prometheus_client import generate_latest

    from ignis.engine.metrics import EngineMetrics
    from ignis.kernels.compile_watch import CompileWatch

    metrics = EngineMetrics("m")
    fn = type("Info", (), {"name": "_decode_split_kernel"})()
    watch = CompileWatch()
    metrics.sync_compiles(watch)
    for key in ("a", "b"):
        watch.before_compile(key=key, fn=fn)
        watch.after_compile(key=key, repr="r", fn=fn)
    metrics.sync_compiles(watch)
    metrics.sync_compiles(watch)  # nothing new: nothing added
    text = generate_latest(metrics.registry).decode()
    assert 'ignis:kernel_compiles_while_serving_total{kernel="_decode_split_kernel",model_name="m"} 2.0' in text
    other = CompileWatch()  # the next model's: its first compile adds one, not its count from zero again
    other.after_compile(key="c", repr="r", fn=fn)
    metrics.sync_compiles(other)
    text = generate_latest(metrics.registry).decode()
    assert 'ignis:kernel_compiles_while_serving_total{kernel="_decode_split_kernel",model_name="m"} 3.0' in text
