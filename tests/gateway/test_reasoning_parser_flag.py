"""``--reasoning-parser``: off leaves a model's reasoning in the content, as vLLM without a parser does;
qwen3 and deepseek_r1 split it as auto does and refuse a model whose tokenizer lacks the markers."""

from __future__ import annotations

import pytest

from ignis.gateway.app import build_app
from ignis.gateway.config import GatewayConfig
from ignis.gateway.tokenizer import ModelFiles
from tests.gateway.tools_http_support import create, tools_gateway

ANSWER = "Let me think.\n</think>\n\nHello."
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", params=["off", "qwen3"])
def gw(request, tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5", "--reasoning-parser", request.param,
                             messages=MESSAGES)


def test_off_keeps_the_reasoning_in_the_content_named_splits_it(gw, request):
    client = gw.client()
    message = create(gw, client, ANSWER, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = message.choices[0].message
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n")  # the template opened the block
    if "off" in request.node.callspec.id:
        assert message.content == ANSWER and getattr(message, "reasoning_content", None) is None
    else:
        assert message.content == "Hello." and message.reasoning_content == "Let me think.\n"


class _NoThinkTokenizer:
    def token_id(self, text):
        return None


def test_a_named_parser_needs_the_markers():
    files = ModelFiles(tokenizer=_NoThinkTokenizer(), chat_template=None, generation_config={})
    with pytest.raises(ValueError, match="--reasoning-parser deepseek_r1: m's tokenizer has no <think>"):
        build_app(GatewayConfig(reasoning_parser="deepseek_r1"), files, "m", "ipc:///nonexistent")
