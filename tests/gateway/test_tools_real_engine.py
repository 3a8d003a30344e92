"""Forced tool calls through ``ignis serve`` on a tiny random Qwen3.5 checkpoint (real tokenizer, official template).

The weights are random, so what the model writes inside a forced call is
noise: the answer must still be well formed, the prompt the engine ran must
end with the call opener, and a named call must come back as that call.
"""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from ignis.gateway.tokenizer import load_model_files
from tests.gateway.conftest import start_serve, stop_serve

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def served(real_checkpoint, tmp_path_factory):
    path = real_checkpoint("qwen3_5").path
    s = start_serve(tmp_path_factory.mktemp("serve-qwen3_5"),
                    ["--model", str(path), "--kv-pool-tokens", "8192", "--decode-lanes", "4"])
    client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield s, client, load_model_files(path).tokenizer
    client.close()
    assert stop_serve(s) == 0, s.log()


def test_named_call_from_a_random_model(served):
    s, client, tok = served
    opener = tok.encode("<tool_call>\n<function=get_weather>\n")
    r = client.chat.completions.create(model=s.model, messages=ASK, tools=[WEATHER], max_tokens=12, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       extra_body={"return_token_ids": True})
    assert r.model_extra["prompt_token_ids"][-len(opener):] == opener
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    chunks = list(client.chat.completions.create(
        model=s.model, messages=ASK, tools=[WEATHER], max_tokens=12, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    named = [tc.function.name for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())
             if tc.id is not None]
    assert named == ["get_weather"]


def test_required_call_from_a_random_model_is_well_formed(served):
    s, client, _ = served
    r = client.chat.completions.create(model=s.model, messages=ASK, tools=[WEATHER], max_tokens=12,
                                       tool_choice="required", extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content is not None or choice.message.tool_calls
    for call in choice.message.tool_calls or ():
        assert isinstance(json.loads(call.function.arguments), dict)


BOOKING = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "required": ["unit", "confirm"], "additionalProperties": False,
    "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "confirm": {"type": "boolean"}}}}}
ALARM = {"type": "function", "function": {"name": "alarm", "parameters": {
    "type": "object", "required": ["loud"], "additionalProperties": False,
    "properties": {"loud": {"type": "boolean"}}}}}


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "book"}}, "required"],
                         ids=["named", "required"])
def test_forced_calls_follow_the_tools_schema(served, tool_choice):
    """A grammar holds the rest of a forced call: even random weights write a call whose arguments
    validate against the tool's schema (finite values here, so every sample can finish)."""
    jsonschema = pytest.importorskip("jsonschema")
    s, client, _ = served
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (BOOKING, ALARM)}
    for seed in range(4):
        # one call (a required choice allows more unless parallel calls are off: see below)
        r = client.chat.completions.create(model=s.model, messages=ASK, tools=[BOOKING, ALARM], max_tokens=64,
                                           temperature=1.0, seed=seed, tool_choice=tool_choice,
                                           parallel_tool_calls=False)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        [call] = choice.message.tool_calls
        if tool_choice != "required":
            assert call.function.name == "book"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    if tool_choice == "required":  # one call or more: each whole call valid (the last may be cut by max_tokens)
        for seed in range(4):
            r = client.chat.completions.create(model=s.model, messages=ASK, tools=[BOOKING, ALARM], max_tokens=64,
                                               temperature=1.0, seed=seed, tool_choice=tool_choice)
            choice = r.choices[0]
            assert choice.finish_reason in ("tool_calls", "length"), choice
            calls = choice.message.tool_calls
            whole = calls if choice.finish_reason == "tool_calls" else calls[:-1]
            assert calls and not choice.message.content
            for call in whole:
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_response_format_with_a_forced_call_is_refused(served):
    s, client, _ = served
    import openai

    with pytest.raises(openai.BadRequestError, match="response_format cannot be combined"):
        client.chat.completions.create(model=s.model, messages=ASK, tools=[BOOKING], max_tokens=8,
                                       tool_choice="required", response_format={"type": "json_object"})
    r = client.chat.completions.create(model=s.model, messages=ASK, max_tokens=2)  # and the next is served
    assert r.choices[0].finish_reason in ("stop", "length")
