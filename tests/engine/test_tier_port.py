"""The null tier port: an engine without lower tiers moves nothing down and finds nothing there."""

from __future__ import annotations

from ignis.engine.tier_port import NO_TIERS


def test_the_null_port_moves_nothing():
    assert NO_TIERS.session == 0
    assert NO_TIERS.demote_retained((1, 2), [0], 0, "agent") is None and NO_TIERS.locate(["k"]) is None
    assert NO_TIERS.restore_retained("k", [0], 0) is None
    assert not NO_TIERS.demote_window("r", 0, [0], "agent") and not NO_TIERS.demote_image("r", 0, "agent")
    assert not NO_TIERS.restore_window("r", 0, [0]) and not NO_TIERS.restore_image("r")
