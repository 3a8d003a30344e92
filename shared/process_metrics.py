"""One process's Prometheus metrics: its own registry, one name prefix, one fixed first label.

Engine, gateway and tierd each subclass ``ProcessMetrics``. Nothing is global:
every instance has its own registry, so tests can run several processes' worth
in one interpreter. Every metric's first label is the one fixed for the whole
process (``model_name`` for engine and gateway, ``instance`` for tierd):

    no further labels   the metric comes back bound to the fixed value, ready
                        to inc / set / observe
    further labels      the family comes back; callers pass the fixed value
                        first: ``family.labels(fixed, ...)``

The scrape is served either by prometheus_client's own HTTP server (``serve``)
or by the process's web app (``render`` with ``content_type``).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds; the default buckets of every latency histogram."""


class ProcessMetrics:
    """The base of EngineMetrics, GatewayMetrics and TierdMetrics: makes their metrics, serves the scrape."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, prefix: str, fixed_label: str, fixed_value: str):
        """Names become ``prefix + name``; ``fixed_label=fixed_value`` labels every metric."""
        self.registry = CollectorRegistry()
        self._prefix = prefix
        self._fixed = (fixed_label,)
        self._fixed_value = fixed_value

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return self._metric(Gauge, name, doc, labels)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return self._metric(Counter, name, doc, labels)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (),
                  buckets: tuple[float, ...] = LATENCY_BUCKETS):
        return self._metric(Histogram, name, doc, labels, buckets=buckets)

    def _metric(self, kind, name: str, doc: str, labels: tuple[str, ...], **options):
        family = kind(self._prefix + name, doc, self._fixed + tuple(labels), registry=self.registry, **options)
        return family.labels(self._fixed_value) if not labels else family

    def render(self) -> bytes:
        """The scrape text of this registry."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
