"""The gateway's own Prometheus metrics (GET /metrics), under the ``ignis:gateway_`` prefix.

One registry per gateway (nothing global, so tests can run several):
requests by endpoint and HTTP status, request latency, time to first token as
the gateway sees it, tokens streamed to clients, streams open right now, and
streams aborted because their client stopped reading
(``ignis:gateway_stream_stalled_aborts_total``, gateway.stream_writer);
and ``ignis:capture_marks_missing_total{mark,reason}``, chat requests served
without a capture mark the gateway could not find (gateway.capture_marks); and
``ignis:gateway_responses_tools_ignored_total{tool}``, hosted tools of
/v1/responses requests left out of the prompt; and
``ignis:gateway_responses_background_total{status}``, background responses
ended, by their last status (gateway.responses_background); and
``ignis:gateway_grammar_lenient_total``, forced tool calls whose schema is held
leniently (gateway.tool_grammars); ``ignis:gateway_grammar_unheld_total``,
tool calls served unheld because the grammar library is missing (the same); and
``ignis:gateway_request_fields_ignored_total{endpoint}``, request fields sent
that nothing read (gateway.ignored_fields); and
``ignis:gateway_wire_errors_total{socket}``, malformed messages from the engine
(logged and dropped; synced at each scrape); and the listening socket's
``ignis:gateway_open_connections``, ``connections_refused_total`` (503 at
``--max-connections`` with every connection in a request) and
``connections_displaced_total`` (idle or header-sending ones closed to make
room), synced at each scrape (gateway.listener).
Served by the app's GET /metrics (``render``); every metric is labelled
``model_name`` first (``ProcessMetrics``).
"""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter

from ignis.shared.process_metrics import LATENCY_BUCKETS as PROCESS_BUCKETS
from ignis.shared.process_metrics import ProcessMetrics
from ignis.shared.synced_counts import SyncedCounts

log = logging.getLogger("ignis.gateway")

LATENCY_BUCKETS = PROCESS_BUCKETS
"""Seconds: the shared buckets (to 7680 s: a request's latency runs to its last byte)."""

MAX_WARNED_NAMES = 256
"""Distinct client-given names (hosted tool types, ignored fields) remembered as warned about; when that
many are, new names are counted and noted in done lines but not logged until the memory is cleared, at
most once every ``WARNED_RESET_S`` (the names are the clients', without bound: one client sending junk
names cannot silence the warnings for good)."""
WARNED_RESET_S = 3600.0


class GatewayMetrics(ProcessMetrics):
    def __init__(self, model_name: str):
        super().__init__("ignis:gateway_", "model_name", model_name)
        self.requests = self.counter("requests", "HTTP requests by endpoint and status", ("endpoint", "status"))
        self.latency = self.histogram("request_latency_seconds", "request arrival to last byte", ("endpoint",),
                                      buckets=LATENCY_BUCKETS)
        self.ttft = self.histogram("time_to_first_token_seconds", "request arrival to the first token",
                                   ("endpoint",), buckets=LATENCY_BUCKETS)
        self.tokens = self.counter("streamed_tokens", "completion tokens sent to clients")
        self.active = self.gauge("active_streams", "completion requests in progress")
        self.stalled = self.counter("stream_stalled_aborts", "streamed requests aborted because the client "
                                    "stopped reading (--stream-buffer-bytes of output waited unwritten)")
        self._marks_warned: set[tuple[str, str]] = set()
        self._tools_warned = _WarnedNames()
        self._fields_warned = _WarnedNames()
        self.marks_missing = Counter("ignis:capture_marks_missing", "chat requests served without a capture mark",
                                     ("model_name", "mark", "reason"), registry=self.registry)
        self.grammar_lenient = self.counter("grammar_lenient", "forced tool calls whose tool schema the grammar "
                                            "library holds leniently (keywords it cannot enforce left out)")
        self.grammar_unheld = self.counter("grammar_unheld", "tool calls a grammar should have held, served "
                                           "unheld: the grammar library (llguidance) is not installed")
        self.tools_ignored = self.counter("responses_tools_ignored", "hosted tools of /v1/responses requests left "
                                          "out of the prompt (ignis cannot run them)", ("tool",))
        self.fields_ignored = self.counter("request_fields_ignored", "request fields sent that ignis does not "
                                           "read (answered without them)", ("endpoint",))
        self.background = self.counter("responses_background", "background /v1/responses runs ended, by status "
                                       "(completed, incomplete, failed, cancelled)", ("status",))
        self.wire_errors = SyncedCounts(self.counter(
            "wire_errors", "malformed messages received (logged and dropped), by socket (engine)", ("socket",)),
            model_name)
        self.open_connections = self.gauge("open_connections", "client connections open now")
        self.connections_refused = SyncedCounts(self.counter(
            "connections_refused", "connections answered 503 at --max-connections (every open one was in a "
            "request)"))
        self.connections_displaced = SyncedCounts(self.counter(
            "connections_displaced", "connections closed at --max-connections to make room (idle, or still "
            "sending headers)"))
        self.model_name = model_name

    def sync_connections(self, open_now: int, refused: int, displaced: int) -> None:
        """The listener's counts at a scrape (``gateway.listener.Connections``)."""
        self.open_connections.set(open_now)
        self.connections_refused.sync(refused)
        self.connections_displaced.sync(displaced)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(self.model_name, endpoint, str(status)).inc()
        self.latency.labels(self.model_name, endpoint).observe(seconds)

    def first_token(self, endpoint: str, seconds: float) -> None:
        self.ttft.labels(self.model_name, endpoint).observe(seconds)

    def tool_ignored(self, tool: str, kind: str | None) -> bool:
        """Count a hosted tool left out (``tool``: its label); True the first time its ``kind`` (the type
        the client sent) is (the caller warns then)."""
        self.tools_ignored.labels(self.model_name, tool).inc()
        return self._tools_warned.first(kind)

    def first_ignored(self, endpoint: str, name: str) -> bool:
        """True the first time request field ``name`` goes unread on ``endpoint`` (the caller warns)."""
        return self._fields_warned.first((endpoint, name))

    def background_ended(self, status: str) -> None:
        self.background.labels(self.model_name, status).inc()

    def mark_missing(self, missing: tuple[tuple[str, str], ...]) -> None:
        """Count each ``(mark, reason)`` of one request; the first of each is a warning (reuse is lost for
        every request like it; the done lines name it each time)."""
        for mark, reason in missing:
            self.marks_missing.labels(self.model_name, mark, reason).inc()
            if (mark, reason) not in self._marks_warned:
                self._marks_warned.add((mark, reason))
                log.warning("capture mark %s not found (%s): requests like this one are served without the reuse "
                            "it gives (docs/api.md, capture marks); counted in ignis:capture_marks_missing_total, "
                            "named in each done line", mark, reason)


class _WarnedNames:
    """Client-given names warned about, bounded (``MAX_WARNED_NAMES``, ``WARNED_RESET_S``)."""

    def __init__(self, clock=time.monotonic):
        self.seen: set = set()
        self.clock = clock
        self.since = clock()

    def first(self, key: object) -> bool:
        """True when ``key`` is to be warned about (remembered from now on)."""
        if key in self.seen:
            return False
        if len(self.seen) >= MAX_WARNED_NAMES:
            if self.clock() - self.since < WARNED_RESET_S:
                return False
            self.seen.clear()
            self.since = self.clock()
        self.seen.add(key)
        return True
