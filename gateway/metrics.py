"""The gateway's own Prometheus metrics (GET /metrics), under the ``ignis:gateway_`` prefix.

One registry per gateway (nothing global, so tests can run several):
requests by endpoint and HTTP status, request latency, time to first token as
the gateway sees it, tokens streamed to clients, and streams open right now.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("ignis:gateway_requests", "HTTP requests by endpoint and status",
                                ("model_name", "endpoint", "status"), registry=r)
        self.latency = Histogram("ignis:gateway_request_latency_seconds", "request arrival to last byte",
                                 ("model_name", "endpoint"), buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("ignis:gateway_time_to_first_token_seconds", "request arrival to the first token",
                              ("model_name", "endpoint"), buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("ignis:gateway_streamed_tokens", "completion tokens sent to clients",
                              ("model_name",), registry=r).labels(model_name)
        self.active = Gauge("ignis:gateway_active_streams", "completion requests in progress",
                            ("model_name",), registry=r).labels(model_name)
        self.model_name = model_name

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(self.model_name, endpoint, str(status)).inc()
        self.latency.labels(self.model_name, endpoint).observe(seconds)

    def first_token(self, endpoint: str, seconds: float) -> None:
        self.ttft.labels(self.model_name, endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
