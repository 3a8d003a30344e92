"""``--scheduling-policy`` (vLLM's): priority (ignis's default) serves by class; fcfs makes every request
interactive and refuses a priority other than 0, as vLLM does."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "seed": 7}


def _post(gw, **fields):
    return http("POST", gw.url + "/v1/chat/completions", json.dumps({**CHAT, **fields}).encode(),
                {"Content-Type": "application/json"})


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_classes_by_policy(tmp_path, policy):
    with fake_gateway(tmp_path, "--scheduling-policy", policy) as gw:
        assert _post(gw, request_class="agent").status == 200
        assert gw.engine.generates[-1].request_class == ("agent" if policy == "priority" else "interactive")
        assert _post(gw, priority=0).status == 200 and gw.engine.generates[-1].request_class == "interactive"
        r = _post(gw, priority=5)
        if policy == "priority":
            assert r.status == 200 and gw.engine.generates[-1].request_class == "agent"
        else:
            assert r.status == 400 and r.json()["error"]["param"] == "priority"
            assert "--scheduling-policy fcfs" in r.json()["error"]["message"]
