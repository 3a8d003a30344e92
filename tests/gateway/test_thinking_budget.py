"""vLLM's ``thinking_token_budget`` and Anthropic's ``thinking.budget_tokens``: read, checked, and the sampling
fields they become with the served model's ids (no server)."""

from __future__ import annotations

import dataclasses

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.messages_api import MessagesTurn
from ignis.gateway.params import parse_common, sampling_for


def common(kind="chat", **body):
    f = Fields(body)
    return f, parse_common(f, {}, kind)


def test_the_budget_becomes_the_engines_fields_with_the_models_ids(demo_tokenizer):
    f, p = common(thinking_token_budget=5)
    assert p.thinking_token_budget == 5 and p.thinking is None  # the ids once the model is known
    p = p.for_model(f, demo_tokenizer)
    start, end = demo_tokenizer.token_id("<think>"), demo_tokenizer.token_id("</think>")
    assert (p.thinking.start_id, p.thinking.end_id) == (start, end)
    assert p.thinking.end_ids == tuple(demo_tokenizer.encode("\n</think>\n\n"))
    assert len(p.thinking.end_ids) == 3 and p.thinking.end_ids[1] == end
    model_opened = sampling_for(p, 40, 0)
    assert (model_opened.thinking_budget, model_opened.thinking_open) == (5, False)
    assert (model_opened.think_start_id, model_opened.think_end_id) == (start, end)
    opened = sampling_for(dataclasses.replace(p, thinking_open=True), 40, 1)
    assert opened.thinking_open and opened.thinking_end_ids == p.thinking.end_ids
    assert common(thinking_token_budget=0)[1].thinking_token_budget == 0


def test_without_a_budget_the_engine_gets_none(demo_tokenizer):
    f, p = common()
    s = sampling_for(p.for_model(f, demo_tokenizer), 40, 0)
    assert s.thinking_budget is None and s.thinking_end_ids == () and s.think_end_id is None


class NoThinkTokenizer:
    vocab_size = 100

    def token_id(self, text):
        return None

    def encode(self, text):
        return [1, 2, 3]


def test_a_model_without_an_end_of_thinking_token_answers_400():
    f, p = common(thinking_token_budget=3)
    with pytest.raises(ApiError, match="no </think> token") as e:
        p.for_model(f, NoThinkTokenizer())
    assert e.value.status == 400 and e.value.param == "thinking_token_budget"


@pytest.mark.parametrize("value", [-1, "5", 2.5, True, [5], {"tokens": 5}, 2**31])
def test_bad_budgets_are_400s_naming_the_field(value):
    with pytest.raises(ApiError) as e:
        common(thinking_token_budget=value)
    assert e.value.status == 400 and e.value.param == "thinking_token_budget"


def test_completions_refuse_the_budget():
    with pytest.raises(ApiError, match="chat/completions") as e:
        common("completion", thinking_token_budget=5)
    assert e.value.param == "thinking_token_budget"
    assert common("completion", thinking_token_budget=None)[1].thinking_token_budget is None


MESSAGES = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}


def test_anthropic_budget_tokens_become_the_budget_when_thinking_is_enabled():
    chat = MessagesTurn().translate({**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 7}})
    assert chat["thinking_token_budget"] == 7 and chat["chat_template_kwargs"] == {"enable_thinking": True}
    # lenient: any positive integer, however far below Anthropic's floor of 1,024 or past max_tokens
    assert MessagesTurn().translate({**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 1}})[
        "thinking_token_budget"] == 1
    assert MessagesTurn().translate({**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 900}})[
        "thinking_token_budget"] == 900
    for thinking in ({"type": "enabled"}, {"type": "disabled", "budget_tokens": 7}, {"type": "adaptive"}):
        assert "thinking_token_budget" not in MessagesTurn().translate({**MESSAGES, "thinking": thinking})


@pytest.mark.parametrize("value", [0, -3, "1024", 1.5, [1024]])
def test_bad_anthropic_budgets_are_400s_naming_the_field(value):
    turn = MessagesTurn()
    with pytest.raises(ApiError) as e:
        turn.translate({**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": value}})
    assert e.value.status == 400 and e.value.param == "thinking.budget_tokens"
    assert turn.remap(ApiError(400, "x", param="thinking_token_budget")).param == "thinking.budget_tokens"
