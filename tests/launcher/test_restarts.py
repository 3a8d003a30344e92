"""The back-off of a child serve restarts: doubling to a ceiling, back to the first delay after a stable run."""

from __future__ import annotations

import pytest

from ignis.launcher.restarts import RestartBackoff


def test_delays_double_up_to_the_ceiling_and_reset_after_a_stable_run():
    b = RestartBackoff(first_s=0.5, most_s=3.0, stable_s=60.0)
    b.ready(0.0)
    assert [b.delay(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.ready(10.0)
    assert b.delay(69.0) == 3.0  # up 59 s: not stable yet
    b.ready(70.0)
    assert b.delay(130.0) == 0.5  # up 60 s: a fresh start
    assert b.restarts == 7


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        RestartBackoff(first_s=0.0)
    with pytest.raises(ValueError):
        RestartBackoff(first_s=5.0, most_s=1.0)
