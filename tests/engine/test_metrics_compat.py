"""--metrics-compat vllm: the vLLM-named metrics twice (ignis: and vllm:), the others once; off: ignis: only."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ignis.engine.metrics import VLLM_NAMES, VLLM_OLD_NAMES, EngineMetrics


def families(metrics: EngineMetrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_compat_exports_the_vllm_names_with_the_same_samples():
    m = EngineMetrics("qwen", vllm_compat=True)
    m.prompt_tokens.inc(7)
    m.finished.labels("qwen", "stop").inc()
    m.ttft.observe(0.3)
    m.running.set(2)
    m.reuse_hits.labels("qwen", "prompt_checkpoint", "device").inc()
    got = families(m)
    vllm = {n for n in got if n.startswith("vllm:")}
    assert vllm == {"vllm:" + n for n in VLLM_NAMES} | {"vllm:" + n for n in VLLM_OLD_NAMES.values()}
    assert not [n for n in got if n.endswith("_created")]  # no creation-time series beside each family
    old = {v: k for k, v in VLLM_OLD_NAMES.items()}
    for name in vllm:
        short = name.split(":", 1)[1]
        own = got["ignis:" + old.get(short, short)]
        assert got[name].type == own.type
        assert [(s.name.split(":", 1)[1].replace(short, old.get(short, short)), s.labels, s.value)
                for s in got[name].samples] == [(s.name.split(":", 1)[1], s.labels, s.value) for s in own.samples]
    assert got["vllm:prompt_tokens"].samples[0].value == 7
    assert got["vllm:request_success"].samples[0].labels == {"model_name": "qwen", "finished_reason": "stop"}
    assert got["vllm:num_requests_running"].samples[0].value == 2


def test_off_exports_ignis_names_only():
    got = families(EngineMetrics("qwen"))
    assert not [n for n in got if not n.startswith("ignis:")]
    assert {"ignis:" + n for n in VLLM_NAMES} <= set(got)
