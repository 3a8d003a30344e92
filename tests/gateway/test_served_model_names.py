"""Several ``--served-model-name`` names (vLLM's ``--served-model-name A B``): every one answers, the first
is the name answers carry and the engine is asked for; ``/v1/models`` lists each."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway
from tests.gateway.tools_http_support import model_dir

NAMES = ("qwen", "Qwen/Qwen3.5-27B", "agent-model")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("names")
    with fake_gateway(tmp, "--model", str(model_dir(tmp, "qwen3_5")), "--served-model-name", *NAMES[:2],
                      "--served-model-name", NAMES[2], "--enable-lora-updating") as gw:
        yield gw.engine, gw.url


def _post(url: str, body: dict):
    return http("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"})


def test_every_name_answers_as_the_first(gateway):
    engine, url = gateway
    assert [m["id"] for m in http("GET", url + "/v1/models").json()["data"]] == list(NAMES)
    assert http("GET", url + "/v1/models/agent-model").json()["id"] == "agent-model"
    assert http("GET", url + "/v1/models/Qwen/Qwen3.5-27B").json()["id"] == "Qwen/Qwen3.5-27B"  # a repo id's slash
    assert http("GET", url + "/v1/models/Qwen/other").status == 404
    for name in NAMES:
        r = _post(url + "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 2, "seed": 7})
        assert r.status == 200, r.body
        assert r.json()["model"] == "qwen" and engine.generates[-1].model == "qwen"
    r = _post(url + "/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status == 404 and "qwen, Qwen/Qwen3.5-27B, agent-model" in r.json()["error"]["message"]


def test_an_adapter_cannot_take_a_models_name(gateway):
    _, url = gateway
    r = _post(url + "/v1/load_lora_adapter", {"lora_name": "agent-model", "lora_path": "/nonexistent"})
    assert r.status == 400 and "names the model 'qwen'" in r.json()["error"]["message"]
