"""engine.runtime: a restore floor no sequence can reach is a warning at start (that tier is written, never read)."""

from __future__ import annotations

import logging

from ignis.engine.runtime import _warn_unreachable_floors


def test_a_floor_at_or_past_the_longest_sequence_is_named(caplog):
    with caplog.at_level(logging.WARNING, logger="ignis.engine"):
        _warn_unreachable_floors({"ram": 64, "disk": 16384}, 8192)
    (record,) = caplog.records
    assert "--restore-floor-kv-disk 16384" in record.getMessage() and "no KV-disk entry" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ignis.engine"):
        _warn_unreachable_floors({"ram": 64, "disk": 8191}, 8192)  # one token short: a resume can reach it
    assert caplog.records == []
