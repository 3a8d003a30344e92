"""vLLM's --max-logprobs: a request asking for more alternatives per token is a 400 naming its field."""

from __future__ import annotations

import pytest

from tests.gateway.hardening_support import fake_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("max-logprobs"), "--max-logprobs", "2") as g:
        yield g


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 3}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 5}, "prompt_logprobs"),
])
def test_more_than_max_logprobs_is_a_400_naming_the_field(gw, path, body, param):
    r = gw.post(path, dict(body, max_tokens=2))
    assert r.status == 400 and r.json()["error"]["param"] == param
    assert "--max-logprobs" in r.json()["error"]["message"]
    within = {k: (2 if k == param else v) for k, v in body.items()}
    assert gw.post(path, dict(within, max_tokens=2)).status == 200
