"""A Prometheus counter kept level with running totals counted elsewhere.

Some counts are plain integers bumped where taking the registry's lock is
not wanted: what a receiving socket could not decode
(``shared.zmq_queues.Channel.garbage_count``, bumped on its I/O thread), the
connections the gateway's listener refused or displaced. The process calls
``sync(total, *labels)`` now and then (its loop, a scrape); the counter's
series for those labels advances by what is new. A source whose total starts
again from zero (a channel replaced after a reload or a reconnect) is a new
source: its whole count is new.
"""

from __future__ import annotations


class SyncedCounts:
    """Advances ``family.labels(*fixed, *labels)`` to each source's running total (with no labels at all,
    ``family`` is the one series itself)."""

    def __init__(self, family, *fixed: str):
        self._family = family
        self._fixed = fixed
        self._seen: dict[tuple[str, ...], int] = {}

    def sync(self, total: int, *labels: str) -> None:
        seen = self._seen.get(labels)
        names = (*self._fixed, *labels)
        series = self._family.labels(*names) if names else self._family  # it exists (at 0) from the first look
        if seen is None or total < seen:  # first look, or a new source under the same labels
            seen = 0
        if total > seen:
            series.inc(total - seen)
        self._seen[labels] = total
