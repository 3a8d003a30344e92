"""A gateway's LoRA adapters follow the engine's list when another gateway (or an engine restart) changed it:
the Stats' ``lora_adapters_version`` moves, the gateway asks ``ListAdapters`` and takes the answer whole."""

from __future__ import annotations

import json
import time

import pytest

from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop


@pytest.fixture
def gateway(tmp_path):
    engine = FakeEngine(f"ipc://{tmp_path}/fake-engine.sock")
    proc, url = start_gateway(tmp_path, f"ipc://{tmp_path}/fake-engine.sock")
    try:
        yield engine, url
    finally:
        stop(proc)
        engine.close()


def _models(url: str) -> list[str]:
    return [m["id"] for m in http("GET", url + "/v1/models").json()["data"]]


def _wait(what: str, fn, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _chat(url: str, model: str):
    return http("POST", url + "/v1/chat/completions", json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "seed": 7}).encode(),
        {"Content-Type": "application/json"})


def test_the_gateway_takes_the_engines_list_when_its_version_moves(gateway):
    engine, url = gateway
    assert _models(url) == ["ignis-demo"]
    engine.adapter_list = (1, ("sql",), ("/srv/adapters/sql",))
    engine.stats_extra = {"lora_adapters_version": 1}  # loaded through another gateway
    _wait("the adapter listed", lambda: _models(url) == ["ignis-demo", "sql"])
    assert _chat(url, "sql").status == 200 and engine.generates[-1].adapter == "sql"
    card = http("GET", url + "/v1/models/sql").json()
    assert card["root"] == "/srv/adapters/sql" and card["parent"] == "ignis-demo"
    engine.adapter_list = (0, (), ())
    engine.stats_extra = {"lora_adapters_version": 0}  # the engine restarted: what was loaded at run time is gone
    _wait("the adapter gone", lambda: _models(url) == ["ignis-demo"])
    assert _chat(url, "sql").status == 404
