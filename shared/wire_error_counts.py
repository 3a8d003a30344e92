"""Malformed messages per socket, as one labelled Prometheus counter.

Every receiving socket counts what it could not decode in a plain integer
(``shared.zmq_queues.Channel.garbage_count``, bumped on its I/O thread without
a lock). The process's loop calls ``sync(socket, total)`` now and then; the
counter ``...wire_errors_total{socket}`` advances by what is new. A source
whose count starts again from zero (a channel replaced after a reload or a
reconnect) is a new source: its whole count is new.
"""

from __future__ import annotations


class WireErrorCounts:
    """Advances ``family.labels(fixed, socket)`` to each socket's running count."""

    def __init__(self, family, fixed_value: str):
        self._family = family
        self._fixed = fixed_value
        self._seen: dict[str, int] = {}

    def sync(self, socket: str, total: int) -> None:
        seen = self._seen.get(socket)
        if seen is None:
            self._family.labels(self._fixed, socket)  # the series exists (at 0) from the first look
            seen = 0
        if total < seen:  # a new source under the same name
            seen = 0
        if total > seen:
            self._family.labels(self._fixed, socket).inc(total - seen)
        self._seen[socket] = total
