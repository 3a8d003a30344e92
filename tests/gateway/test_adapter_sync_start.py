"""A gateway takes the engine's list of LoRA adapters from each engine instance's first Stats, whatever its
version (``gateway.adapter_sync``).

Engine and gateway run as separate units: the ``--lora-modules`` a gateway
was started with may not be the engine's (given to the engine only, or an
adapter the engine was never told of), and an engine may restart with other
flags. The version alone (0 on both sides until a run-time load or unload)
would never show the difference; the engine's start time does.
"""

from __future__ import annotations

import json

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway, wait_until


def _models(url: str) -> list[str]:
    return [m["id"] for m in http("GET", url + "/v1/models").json()["data"]]


def _chat(url: str, model: str):
    return http("POST", url + "/v1/chat/completions", json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "seed": 7}).encode(),
        {"Content-Type": "application/json"})


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
