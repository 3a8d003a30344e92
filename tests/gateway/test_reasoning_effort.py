"""OpenAI's ``reasoning_effort`` on chat completions: none and minimal close Qwen3.5's thinking block in the
prompt, the other efforts open it; the request's own ``chat_template_kwargs`` win; a bad value is a 400."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.reasoning_effort import with_effort
from tests.gateway.conftest import http
from tests.gateway.tools_http_support import tools_gateway

MESSAGES = [{"role": "user", "content": "Hi"}]
OPEN, CLOSED = "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_the_effort_fills_what_the_request_leaves_unsaid():
    assert with_effort({}, None) == {}
    assert with_effort({}, "minimal") == {"enable_thinking": False, "reasoning_effort": "minimal"}
    assert with_effort({"enable_thinking": False}, "high") == {"enable_thinking": False, "reasoning_effort": "high"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5", messages=MESSAGES)


def _prompt(gw, **fields) -> str:
    r = http("POST", gw.url + "/v1/chat/completions", json.dumps(
        {"messages": MESSAGES, "max_tokens": 2, "seed": gw.say("ok"), **fields}).encode(),
        {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    return gw.last_prompt()


def test_reasoning_effort_opens_or_closes_the_thinking_block(gw):
    assert _prompt(gw).endswith(CLOSED)  # this template's default: no thinking
    for effort in ("low", "medium", "high", "xhigh"):
        assert _prompt(gw, reasoning_effort=effort).endswith(OPEN)
    for effort in ("none", "minimal"):
        assert _prompt(gw, reasoning_effort=effort, chat_template_kwargs={"enable_thinking": True}).endswith(OPEN)
        assert _prompt(gw, reasoning_effort=effort).endswith(CLOSED)
    tokens = http("POST", gw.url + "/tokenize", json.dumps({"messages": MESSAGES, "reasoning_effort": "high"}).encode(),
                  {"Content-Type": "application/json"}).json()["tokens"]
    assert gw.tokenizer.decode(tokens, skip_special_tokens=False).endswith(OPEN)  # /tokenize renders alike


def test_a_bad_effort_is_named(gw):
    r = http("POST", gw.url + "/v1/chat/completions", json.dumps(
        {"messages": MESSAGES, "reasoning_effort": "max"}).encode(), {"Content-Type": "application/json"})
    assert r.status == 400 and r.json()["error"]["param"] == "reasoning_effort"
