"""One process's Prometheus metrics: its own registry, one name prefix, one fixed first label.

Engine, gateway and tierd each subclass ``ProcessMetrics``. Nothing is global:
every instance has its own registry, so tests can run several processes' worth
in one interpreter. Every metric's first label is the one fixed for the whole
process (``model_name`` for engine and gateway, ``instance`` for tierd):

    no further labels   the metric comes back bound to the fixed value, ready
                        to inc / set / observe
    further labels      the family comes back; callers pass the fixed value
                        first: ``family.labels(fixed, ...)``

The scrape is served either by ``serve``'s own HTTP server on a daemon thread
(engine and tierd) or by the process's web app (``render`` with
``content_type``; the gateway). Both answer Prometheus's text format 0.0.4,
whatever the scraper's Accept header asks: prometheus_client's own server
would answer Prometheus 2.x's default Accept (OpenMetrics first) with
OpenMetrics whose samples it renames ``ignis:x`` -> ``ignis_x``, which no
dashboard reads and its own parser rejects. ``serve`` answers GET and HEAD on
any path (``/metrics``, ``/``), gzipped when the client accepts gzip.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""Seconds; the default buckets of every latency histogram (up to vLLM's longest, 7680 s: a long generation
on a large model runs for minutes, and a quantile past the last bucket reads as that bucket)."""

disable_created_metrics()
"""No ``<name>_created`` series beside every counter and histogram (prometheus_client's default): they
double the series Prometheus stores and no dashboard reads them. Process-wide, as each ignis process is."""


class ProcessMetrics:
    """The base of EngineMetrics, GatewayMetrics and TierdMetrics: makes their metrics, serves the scrape."""

    content_type = CONTENT_TYPE_PLAIN_0_0_4
    """What ``render`` returns: the text format 0.0.4, colon names as they are."""

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
        """Start the HTTP endpoint on a daemon thread; returns the bound port (useful with port 0).

        Raises OSError when ``host:port`` cannot be bound.
        """
        family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server = _ScrapeServer.bind(family, sockaddr[0], port, self)
        threading.Thread(target=server.serve_forever, name=f"metrics:{server.server_port}", daemon=True).start()
        return int(server.server_port)


class _ScrapeServer(ThreadingHTTPServer):
    """One thread per scrape, every one a daemon; ``metrics`` is what it serves."""

    daemon_threads = True
    metrics: ProcessMetrics

    @classmethod
    def bind(cls, family: int, host: str, port: int, metrics: ProcessMetrics) -> _ScrapeServer:
        bound = type(cls.__name__, (cls,), {"address_family": family})  # IPv4 or IPv6, as ``host`` is
        server = bound((host, port), _ScrapeHandler)
        server.metrics = metrics
        return server


class _ScrapeHandler(BaseHTTPRequestHandler):
    """GET or HEAD, any path: the registry in text format 0.0.4 (``?name[]=`` narrows it, as in prometheus_client)."""

    server: _ScrapeServer

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_OPTIONS(self) -> None:
        self._refuse(200)

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # any other method: 405, as prometheus_client's server answered
            return lambda: self._refuse(405)
        raise AttributeError(name)

    def _refuse(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Allow", "GET, HEAD, OPTIONS")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, with_body: bool) -> None:
        metrics = self.server.metrics
        try:
            registry = metrics.registry
            names = parse_qs(urlsplit(self.path).query).get("name[]")
            if names and isinstance(registry, CollectorRegistry):
                registry = registry.restricted_registry(names)
            body = generate_latest(registry)
        except Exception:
            log.exception("metrics scrape failed")
            self.send_error(500, "metrics collection failed")
            return
        gzipped = _accepts_gzip(self.headers.get("Accept-Encoding", ""))
        if gzipped:
            body = gzip.compress(body)
        self.send_response(200)
        self.send_header("Content-Type", metrics.content_type)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        """Scrapes go unlogged."""


def _accepts_gzip(accept_encoding: str) -> bool:
    for coding in accept_encoding.split(","):
        name, *params = (part.strip() for part in coding.split(";"))
        if name.lower() == "gzip":
            return not any(p.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params)
    return False
