"""A gateway's LoRA adapters follow the engine's list when another gateway (or an engine restart) changed it:
the Stats' ``lora_adapters_version`` moves, the gateway asks ``ListAdapters`` and takes the answer whole.

It also takes the list from each engine instance's first Stats, whatever the
version: engine and gateway run as separate units, so the ``--lora-modules``
a gateway was started with may not be the engine's (given to the engine
only, or an adapter the engine was never told of), and an engine may restart
with other flags. The version alone (0 on both sides until a run-time load or
unload) would never show the difference; the engine's start time does."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway, wait_until


@pytest.fixture
def gateway(tmp_path):
    with fake_gateway(tmp_path) as gw:
        yield gw.engine, gw.url


def _models(url: str) -> list[str]:
    return [m["id"] for m in http("GET", url + "/v1/models").json()["data"]]


def _chat(url: str, model: str):
    return http("POST", url + "/v1/chat/completions", json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "seed": 7}).encode(),
        {"Content-Type": "application/json"})


def test_the_gateway_takes_the_engines_list_when_its_version_moves(gateway):
    engine, url = gateway
    assert _models(url) == ["ignis-demo"]
    engine.adapter_list = (1, ("sql",), ("/srv/adapters/sql",))
    engine.stats_extra = {"lora_adapters_version": 1}  # loaded through another gateway
    wait_until(lambda: _models(url) == ["ignis-demo", "sql"], 15, "the adapter is not listed")
    assert _chat(url, "sql").status == 200 and engine.generates[-1].adapter == "sql"
    card = http("GET", url + "/v1/models/sql").json()
    assert card["root"] == "/srv/adapters/sql" and card["parent"] == "ignis-demo"
    engine.adapter_list = (0, (), ())
    engine.stats_extra = {"lora_adapters_version": 0}  # the engine restarted: what was loaded at run time is gone
    wait_until(lambda: _models(url) == ["ignis-demo"], 15, "the adapter is still listed")
    assert _chat(url, "sql").status == 404


def test_the_engines_adapters_are_listed_though_the_gateway_was_not_given_them(tmp_path):
    with fake_gateway(tmp_path) as gw:
        engine = gw.engine
        engine.adapter_list = (0, ("sql",), ("/srv/adapters/sql",))  # the engine's --lora-modules
        engine.stats_extra = {"lora_adapters_version": 0}
        wait_until(lambda: _models(gw.url) == ["ignis-demo", "sql"], 15, "the engine's adapter is not listed")
        assert _chat(gw.url, "sql").status == 200 and engine.generates[-1].adapter == "sql"
        engine.adapter_list = (0, (), ())
        engine.started = 2.0  # restarted without the flag: the version is 0 again, the list another
        wait_until(lambda: _models(gw.url) == ["ignis-demo"], 15, "the adapter is still listed")
        assert _chat(gw.url, "sql").status == 404


def test_an_adapter_only_the_gateway_was_given_is_let_go(tmp_path):
    with fake_gateway(tmp_path, "--lora-modules", f"ghost={tmp_path}") as gw:
        gw.engine.stats_extra = {"lora_adapters_version": 0}  # the engine serves none
        wait_until(lambda: _models(gw.url) == ["ignis-demo"], 15, "an adapter the engine lacks is listed")
        assert _chat(gw.url, "ghost").status == 404
