"""The name of a LoRA adapter to load (``gateway.lora_api``): printable ASCII without spaces, as a request id,
else a 400 naming ``lora_name`` before the engine is asked, so a name cannot forge or dress a log line."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway
from tests.gateway.tools_http_support import model_dir


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-names")
    with fake_gateway(tmp, "--model", str(model_dir(tmp, "qwen3_5")), "--enable-lora-updating") as gw:
        yield gw.url


@pytest.mark.parametrize("name", ["x\nFORGED engine INFO line", "red\x1b[31m", "two words", "caf\u00e9", "x" * 257])
def test_a_name_that_is_not_printable_ascii_is_a_400(url, name):
    r = http("POST", url + "/v1/load_lora_adapter", json.dumps({"lora_name": name, "lora_path": "/a"}).encode(),
             {"Content-Type": "application/json"}, timeout=10)
    error = r.json()["error"]
    assert r.status == 400 and error["param"] == "lora_name", r.body
    assert "printable ASCII characters without spaces" in error["message"] or "at most 256" in error["message"]
