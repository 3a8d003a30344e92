"""The gateway's /metrics, parsed with prometheus_client; counters move with requests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import http


def scrape(url: str) -> dict[str, float]:
    reply = http("GET", url + "/metrics")
    assert reply.status == 200  # open: no key needed
    values = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            labels = "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            values[s.name + labels] = s.value
    return values


def test_request_and_token_counters_move(server, client):
    before = scrape(server.url)
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    after = scrape(server.url)
    key = next(k for k in after if k.startswith("ignis:gateway_requests_total") and "status=200" in k
               and "chat" in k)
    assert after[key] - before.get(key, 0) == 1
    assert after["ignis:gateway_streamed_tokens_total"] - before.get("ignis:gateway_streamed_tokens_total", 0) == 5
    lat = next(k for k in after if k.startswith("ignis:gateway_request_latency_seconds_count") and "chat" in k)
    assert after[lat] - before.get(lat, 0) == 1
