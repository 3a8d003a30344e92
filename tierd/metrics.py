"""tierd's Prometheus metrics (``--metrics-port``), under the ``ignis:tierd_`` prefix, in its own registry.

Gauges are set from the server's bookkeeping after every change; counters
count events; ``restore_seconds{tier}`` is the latency histogram of the
copies of restores. ``arena_unlocked_bytes`` above zero means part of the arena
can be swapped out: the log says so at start too. Every metric is labelled
``instance`` first (``ProcessMetrics``).
"""

from __future__ import annotations

from ignis.shared.process_metrics import ProcessMetrics
from ignis.shared.synced_counts import SyncedCounts

RESTORE_TIERS = {"ram_to_engine": "ram", "disk_to_engine": "disk"}
"""Copy directions that are restores, and the tier each reads."""


class TierdMetrics(ProcessMetrics):
    def __init__(self, instance: str):
        super().__init__("ignis:tierd_", "instance", instance)
        self.instance = instance
        self.arena_bytes = self.gauge("arena_bytes", "KV-RAM arena size")
        self.arena_mapped = self.gauge("arena_mapped_bytes", "arena bytes mapped now (0 while no engine is "
                                       "attached: a Bye gives the memory back, the next hello takes it again)")
        self.arena_used = self.gauge("arena_used_bytes", "arena bytes in blocks held by entries")
        self.arena_locked = self.gauge("arena_locked_bytes", "arena bytes locked in memory (mlock)")
        self.arena_unlocked = self.gauge("arena_unlocked_bytes", "arena bytes NOT locked (can be swapped out)")
        self.disk_used = self.gauge("disk_used_bytes", "KV-disk bytes in files and reservations")
        self.disk_ceiling = self.gauge("disk_ceiling_bytes", "KV-disk byte ceiling (0: KV-disk off)")
        self.copies_in_flight = self.gauge("copies_in_flight", "copies and KV-disk jobs queued or running")
        self._entries = self.gauge("entries", "entries held, by tier and kind", ("tier", "kind"))
        self._demotions = self.counter("demotions", "completed demotes by the tier they landed in and kind",
                                       ("tier", "kind"))
        self._restores = self.counter("restores", "completed restores by the tier read and kind", ("tier", "kind"))
        self._discards = self.counter("discards", "entries discarded to make room, by tier and kind", ("tier", "kind"))
        self._discards_disk_down = self.counter(
            "discards_disk_down", "KV-RAM entries discarded for room while KV-disk took no writes (after a failed "
            "write, for its retry period): with KV-disk up they would have been spilled, by kind", ("kind",))
        self._spills = self.counter("spills", "entries moved from KV-RAM to KV-disk, by kind", ("kind",))
        self._promotions = self.counter("promotions", "entries resting on KV-disk filled back into KV-RAM from "
                                        "the engine's copy (a demote of a key held on disk only), by kind",
                                        ("kind",))
        self._refusals = self.counter("refusals", "requests refused, by reason", ("reason",))
        self._missing = self.counter("missing", "restores answered missing, by reason", ("reason",))
        self._copy_bytes = self.counter("copy_bytes", "bytes copied, by direction", ("direction",))
        self._copy_seconds = self.counter("copy_seconds", "seconds spent copying, by direction", ("direction",))
        self._copy_gbps = self.gauge("copy_gbps", "rate of the last copy, GB/s, by direction", ("direction",))
        self._check_failures = self.counter("checksum_failures", "KV-disk files that failed a check on restore, "
                                            "by check (checksum, size, header, short_read, gone)", ("check",))
        self._disk_write_failures = self.counter(
            "disk_write_failures", "KV-disk writes that failed (the entry dropped, its partial file removed), by "
            "reason (disk_full: ENOSPC or EDQUOT; io_error: any other OS error; other)", ("reason",))
        self.wire_errors = SyncedCounts(self.counter(
            "wire_errors", "malformed messages received, by socket (engine)", ("socket",)), instance)
        self._restore_seconds = self.histogram("restore_seconds", "seconds a restore's copy to the engine took, "
                                               "by the tier read", ("tier",))

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

    def disk_write_failed(self, reason: str) -> None:
        self._disk_write_failures.labels(self.instance, reason).inc()

    def discarded(self, tier: str, kind: str, *, disk_down: bool = False) -> None:
        """``disk_down``: a KV-RAM entry that KV-disk would have taken, were it taking writes."""
        self._discards.labels(self.instance, tier, kind).inc()
        if disk_down:
            self._discards_disk_down.labels(self.instance, kind).inc()

    def spilled(self, kind: str) -> None:
        self._spills.labels(self.instance, kind).inc()

    def promoted(self, kind: str) -> None:
        self._promotions.labels(self.instance, kind).inc()

    def refused(self, reason: str) -> None:
        self._refusals.labels(self.instance, reason).inc()

    def missing(self, reason: str) -> None:
        self._missing.labels(self.instance, reason).inc()

    def copied(self, direction: str, nbytes: int, seconds: float) -> None:
        """``direction``: engine_to_ram, ram_to_engine, engine_to_disk, disk_to_engine, ram_to_disk."""
        self._copy_bytes.labels(self.instance, direction).inc(nbytes)
        self._copy_seconds.labels(self.instance, direction).inc(seconds)
        tier = RESTORE_TIERS.get(direction)
        if tier is not None:
            self._restore_seconds.labels(self.instance, tier).observe(seconds)
        if seconds > 0:
            self._copy_gbps.labels(self.instance, direction).set(nbytes / seconds / 1e9)
