"""tierd's Prometheus metrics (``--metrics-port``), under the ``ignis:tierd_`` prefix, in its own registry.

Gauges are set from the server's bookkeeping after every change; counters
count events. ``arena_unlocked_bytes`` above zero means part of the arena
can be swapped out: the log says so at start too.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class TierdMetrics:
    def __init__(self, instance: str):
        self.registry = r = CollectorRegistry()
        self.instance = instance
        base = ("instance",)

        def gauge(name, doc, labels=()):
            g = Gauge(f"ignis:tierd_{name}", doc, base + tuple(labels), registry=r)
            return g if labels else g.labels(instance)

        def counter(name, doc, labels=()):
            c = Counter(f"ignis:tierd_{name}", doc, base + tuple(labels), registry=r)
            return c if labels else c.labels(instance)

        self.arena_bytes = gauge("arena_bytes", "KV-RAM arena size")
        self.arena_used = gauge("arena_used_bytes", "arena bytes in blocks held by entries")
        self.arena_locked = gauge("arena_locked_bytes", "arena bytes locked in memory (mlock)")
        self.arena_unlocked = gauge("arena_unlocked_bytes", "arena bytes NOT locked (can be swapped out)")
        self.disk_used = gauge("disk_used_bytes", "KV-disk bytes in files and reservations")
        self.disk_ceiling = gauge("disk_ceiling_bytes", "KV-disk byte ceiling (0: KV-disk off)")
        self.copies_in_flight = gauge("copies_in_flight", "copies and KV-disk jobs queued or running")
        self._entries = gauge("entries", "entries held, by tier and kind", ("tier", "kind"))
        self._demotions = counter("demotions", "completed demotes by the tier they landed in and kind",
                                  ("tier", "kind"))
        self._restores = counter("restores", "completed restores by the tier read and kind", ("tier", "kind"))
        self._discards = counter("discards", "entries discarded to make room, by tier and kind", ("tier", "kind"))
        self._spills = counter("spills", "entries moved from KV-RAM to KV-disk, by kind", ("kind",))
        self._refusals = counter("refusals", "requests refused, by reason", ("reason",))
        self._missing = counter("missing", "restores answered missing, by reason", ("reason",))
        self._copy_bytes = counter("copy_bytes", "bytes copied, by direction", ("direction",))
        self._copy_seconds = counter("copy_seconds", "seconds spent copying, by direction", ("direction",))
        self._copy_gbps = gauge("copy_gbps", "rate of the last copy, GB/s, by direction", ("direction",))
        self._check_failures = counter("checksum_failures", "KV-disk files that failed a check on restore, "
                                       "by check (checksum, size, header, short_read, gone)", ("check",))
        self.wire_errors = counter("wire_errors", "malformed messages received")

    def set_entries(self, counts: dict[tuple[str, str], int]) -> None:
        for tier in ("ram", "disk"):
            for kind in ("retained", "live"):
                self._entries.labels(self.instance, tier, kind).set(counts.get((tier, kind), 0))

    def demoted(self, tier: str, kind: str) -> None:
        self._demotions.labels(self.instance, tier, kind).inc()

    def restored(self, tier: str, kind: str) -> None:
        self._restores.labels(self.instance, tier, kind).inc()

    def check_failed(self, check: str) -> None:
        self._check_failures.labels(self.instance, check).inc()

    def discarded(self, tier: str, kind: str) -> None:
        self._discards.labels(self.instance, tier, kind).inc()

    def spilled(self, kind: str) -> None:
        self._spills.labels(self.instance, kind).inc()

    def refused(self, reason: str) -> None:
        self._refusals.labels(self.instance, reason).inc()

    def missing(self, reason: str) -> None:
        self._missing.labels(self.instance, reason).inc()

    def copied(self, direction: str, nbytes: int, seconds: float) -> None:
        """``direction``: engine_to_ram, ram_to_engine, engine_to_disk, disk_to_engine, ram_to_disk."""
        self._copy_bytes.labels(self.instance, direction).inc(nbytes)
        self._copy_seconds.labels(self.instance, direction).inc(seconds)
        if seconds > 0:
            self._copy_gbps.labels(self.instance, direction).set(nbytes / seconds / 1e9)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
