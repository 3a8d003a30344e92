"""--cpu-threads: the engine's CPU math leaves a core to the gateway and tierd unless told otherwise."""

from __future__ import annotations

import os

import pytest

from ignis.engine.config import EngineConfig


def test_default_is_the_usable_cpus_minus_one(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert EngineConfig().resolved_cpu_threads() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    assert EngineConfig().resolved_cpu_threads() == 1, "never below one"
    assert EngineConfig(cpu_threads=6).resolved_cpu_threads() == 6


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2"])
def test_a_bad_count_is_refused(bad):
    with pytest.raises(ValueError, match="--cpu-threads"):
        EngineConfig(cpu_threads=bad)
