"""ProcessMetrics.serve (engine, tierd): Prometheus text 0.0.4 with the colon names, whatever the Accept header."""

from __future__ import annotations

import gzip
import http.client
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ignis.engine.metrics import VllmNames
from ignis.shared.process_metrics import ProcessMetrics

PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                       "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
"""What Prometheus 2.x sends by default: OpenMetrics first."""

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture(scope="module")
def served():
    """A registry made the way the engine makes its own, with a ``vllm:`` twin as under --metrics-compat vllm."""
    m = ProcessMetrics("ignis:", "model_name", "m")
    m.counter("num_preemptions", "preemptions").inc(3)
    m.counter("test_events", "events by kind", ("kind",)).labels("m", "a").inc(2)
    m.gauge("num_requests_running", "running").set(5)
    m.histogram("time_to_first_token_seconds", "ttft").observe(0.02)
    inner, m.registry = m.registry, CollectorRegistry()  # as EngineMetrics does under --metrics-compat vllm
    m.registry.register(VllmNames(inner))
    port = m.serve(0, "127.0.0.1")
    return port


def scrape(port: int, path: str = "/metrics", **headers) -> tuple[str, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as r:
        body = r.read()
        got = {k.lower(): v for k, v in r.headers.items()}
    if got.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode(), got


def samples(text: str) -> dict[tuple[str, str], dict]:
    """(family name, sample name) -> {labels as a frozenset: value}."""
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault((family.name, s.name), {})[frozenset(s.labels.items())] = s.value
    return out


@pytest.mark.parametrize("accept", [PROMETHEUS_2_ACCEPT, None, "application/openmetrics-text;version=1.0.0",
                                    "text/plain;version=1.0.0;escaping=underscores", "*/*"],
                         ids=["prometheus-2", "no-accept", "openmetrics", "text-1.0.0", "any"])
def test_colon_names_whatever_the_accept_header(served, accept):
    text, headers = scrape(served, **({"Accept": accept} if accept is not None else {}))
    assert headers["content-type"] == TEXT_0_0_4
    assert "# EOF" not in text
    got = samples(text)
    model = frozenset({("model_name", "m")})
    assert got[("ignis:num_preemptions", "ignis:num_preemptions_total")] == {model: 3}
    assert got[("vllm:num_preemptions", "vllm:num_preemptions_total")] == {model: 3}
    assert got[("ignis:test_events", "ignis:test_events_total")] == {model | {("kind", "a")}: 2}
    assert got[("ignis:num_requests_running", "ignis:num_requests_running")] == {model: 5}
    assert got[("vllm:num_requests_running", "vllm:num_requests_running")] == {model: 5}
    assert got[("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")] == {model: 1}
    assert not any("_" in family.split(":")[0] for family, _ in got if family.startswith(("ignis", "vllm")))
    assert "ignis_" not in text and "vllm_" not in text


def test_root_path_and_gzip(served):
    plain, _ = scrape(served, "/")
    zipped, headers = scrape(served, "/metrics", **{"Accept": PROMETHEUS_2_ACCEPT, "Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip"
    assert headers["content-type"] == TEXT_0_0_4
    assert samples(plain)[("ignis:num_preemptions", "ignis:num_preemptions_total")] == \
        samples(zipped)[("ignis:num_preemptions", "ignis:num_preemptions_total")]


def test_head_answers_headers_only(served):
    conn = http.client.HTTPConnection("127.0.0.1", served, timeout=5)
    try:
        conn.request("HEAD", "/metrics", headers={"Accept": PROMETHEUS_2_ACCEPT})
        r = conn.getresponse()
        assert r.status == 200
        assert r.getheader("Content-Type") == TEXT_0_0_4
        assert r.read() == b""
    finally:
        conn.close()


def test_other_methods_refused(served):
    request = urllib.request.Request(f"http://127.0.0.1:{served}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 405


def test_port_in_use_raises_oserror(served):
    with pytest.raises(OSError):
        ProcessMetrics("ignis:", "model_name", "m").serve(served, "127.0.0.1")


def test_render_matches_content_type():
    m = ProcessMetrics("ignis:", "model_name", "m")
    m.gauge("x", "x").set(1)
    assert m.content_type == TEXT_0_0_4
    assert samples(m.render().decode())[("ignis:x", "ignis:x")] == {frozenset({("model_name", "m")}): 1}
