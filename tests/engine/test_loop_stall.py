"""How the engine's loop stall counts for its watchdogs (shared.loop_watchdog, systemd's): a model load only
past its grace.

The whole path (a stuck round aborted with its stacks, the engine restarted
by ``ignis serve``) is tests/launcher/test_serve.py's.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.served_models import LOAD_GRACE_S, ServedModels
from ignis.engine.server import EngineServer


def _server(last_loop: float, loading_since: float | None, load_ended: float = 0.0):
    server = SimpleNamespace(_last_loop=last_loop,
                             models=SimpleNamespace(loading_since=loading_since, load_ended=load_ended))
    server.stall = lambda: EngineServer.stall(server)
    return server


def test_a_model_load_counts_only_past_its_grace_and_its_end_restarts_the_count():
    now = time.monotonic()
    assert EngineServer.stall(_server(now - 40, None)) >= 40  # a turn 40 s long
    assert not EngineServer.alive(_server(now - 40, None))
    loading = _server(now - 500, now - 400)  # a load 400 s in: within its grace
    assert EngineServer.stall(loading) == 0.0 and EngineServer.alive(loading)
    late = EngineServer.stall(_server(now - 900, now - LOAD_GRACE_S - 50))
    assert 49 <= late < 60
    # the load just ended and the loop has not turned since: the load's time is not a stall
    assert EngineServer.stall(_server(now - 500, None, load_ended=now)) < 1


def test_served_models_mark_a_load_while_it_runs_even_when_it_fails():
    seen = []

    def loader(name):
        seen.append(models.loading_since)
        if name == "bad":
            raise OSError("no such checkpoint")
        return SimpleNamespace(name=name)

    models = ServedModels(SimpleNamespace(name="a"), {"a": None, "bad": None}, loader)
    models.runtime = None
    before = time.monotonic()
    models.load("a")
    assert seen[0] is not None and seen[0] >= before and models.loading_since is None
    assert models.load_ended >= seen[0]
    models.runtime = None
    with pytest.raises(OSError):
        models.load("bad")
    assert models.loading_since is None


def test_the_flag_defaults_to_sglangs_300_s_and_refuses_negatives():
    assert EngineConfig().watchdog_timeout == 300.0
    assert EngineConfig(watchdog_timeout=0).watchdog_timeout == 0
    with pytest.raises(ValueError, match="--watchdog-timeout"):
        EngineConfig(watchdog_timeout=-1)
