"""engine.runtime: a restore floor no sequence can reach, in a tier tierd offers, is a warning at start (that
tier is written, never read); a tier tierd has off says nothing."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from ignis.engine.runtime import _warn_unreachable_floors

BOTH = SimpleNamespace(arena_bytes=1 << 20, disk_bytes=1 << 30)


def _warnings(caplog, floors, max_len, welcome) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ignis.engine"):
        _warn_unreachable_floors(floors, max_len, welcome)
    return [r.getMessage() for r in caplog.records]


def test_a_floor_at_or_past_the_longest_sequence_is_named(caplog):
    (message,) = _warnings(caplog, {"ram": 64, "disk": 16384}, 8192, BOTH)
    assert "--restore-floor-kv-disk 16384" in message and "no KV-disk entry" in message
    assert _warnings(caplog, {"ram": 64, "disk": 8191}, 8192, BOTH) == []  # one token short: reachable


def test_a_tier_tierd_does_not_offer_or_an_unanswered_hello_says_nothing(caplog):
    no_disk = SimpleNamespace(arena_bytes=1 << 20, disk_bytes=0)
    assert _warnings(caplog, {"ram": 64, "disk": 16384}, 8192, no_disk) == []
    assert _warnings(caplog, {"ram": 64, "disk": 16384}, 8192, None) == []
