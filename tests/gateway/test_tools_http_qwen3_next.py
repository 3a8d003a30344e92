"""Hermes tool calls (JSON in <tool_call>) through HTTP under the Qwen3-Next-style template, and the
``--tool-call-parser`` flag overriding the format the template suggests.

The engine is scripted (``fake_engine``); see test_tools_http_qwen3_5.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.tools_http_support import assemble, create, streamed, tools_gateway

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
TOOLS = [WEATHER]
ASK = [{"role": "user", "content": "Weather in Rome and Oslo?"}]


def hermes_call(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


TWO_CALLS = (hermes_call("get_weather", {"city": "Rome", "days": 1}) + "\n"
             + hermes_call("get_weather", {"city": "Oslo"}))


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_next", messages=ASK, tools=TOOLS)


@pytest.fixture(scope="module")
def client(gw):
    with gw.client() as c:
        yield c


def test_calls_and_reasoning_not_streamed(gw, client):
    r = create(gw, client, "<think>\nTwo cities.\n</think>\n\n" + TWO_CALLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.reasoning_content == "Two cities.\n" and msg.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Rome", "days": 1}), ("get_weather", {"city": "Oslo"})]


def test_calls_streamed(gw, client):
    deltas, reasons = streamed(gw, client, "<think>\nTwo cities.\n</think>\n\n" + TWO_CALLS)
    assert reasons == ["tool_calls"]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Two cities.\n"
    assert "".join(d.content or "" for d in deltas) == ""
    calls, _ = assemble(deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Rome", "days": 1}),
                                                                        ("get_weather", {"city": "Oslo"})]


def test_thinking_off_closes_the_block_in_the_prompt(gw, client):
    r = create(gw, client, "Hi.", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r.choices[0].message.content == "Hi." and getattr(r.choices[0].message, "reasoning_content", None) is None


def test_malformed_call_is_content(gw, client):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    r = create(gw, client, text)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == "stop"


def test_named_tool_choice_forces_the_hermes_opener(gw, client):
    r = create(gw, client, '{"city": "Bern"}}\n</tool_call>',
               tool_choice={"type": "function", "function": {"name": "get_weather"}})
    opener = gw.tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments":')
    assert gw.last_prompt_ids()[-len(opener):] == opener
    assert [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls] == [
        ("get_weather", {"city": "Bern"})]


def test_history_call_arguments_render_as_json(gw, client):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    create(gw, client, "Sunny.", messages=messages)
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>") in gw.last_prompt()


@pytest.fixture(scope="module")
def xml_gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_next", "--tool-call-parser", "qwen3_xml")


def test_tool_call_parser_flag_overrides_the_template(xml_gw):
    with xml_gw.client() as client:
        r = client.chat.completions.create(
            model="qwen3_next", messages=ASK, tools=TOOLS, max_tokens=100,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            seed=xml_gw.say("<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>"))
    assert xml_gw.last_prompt().endswith("<tool_call>\n<function=get_weather>\n")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls] == [
        ("get_weather", {"days": 5})]


def test_a_tool_schema_the_grammar_cannot_hold_exactly_is_forced_leniently_and_counted(gw, client):
    from tests.gateway.conftest import http

    odd = {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}, "n": {"type": "integer"}}}}}

    def lenient_count() -> float:
        for line in http("GET", gw.url + "/metrics").body.decode().splitlines():
            if line.startswith("ignis:gateway_grammar_lenient_total"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = lenient_count()
    r = create(gw, client, '{"name": "odd", "arguments": {"n": 1}}\n</tool_call>', tools=[odd],
               tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "odd"
    assert gw.engine.generates[-1].grammar is not None
    assert lenient_count() == before + 1
    assert gw.engine.generates[-1].notes == "tool_choice required call: schema held leniently"  # the done line's
    create(gw, client, "Sunny.", tools=TOOLS, tool_choice="required")  # an exact schema is not counted
    assert lenient_count() == before + 1 and gw.engine.generates[-1].notes is None
    broken = {"type": "function", "function": {"name": "broken", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        create(gw, client, "x", tools=[broken], tool_choice="required")
    assert e.value.body["param"] == "tool_choice" and "nowhere" in e.value.body["message"]


def test_a_multi_part_message_reaches_the_qwen3_next_template_as_its_joined_text(gw, client):
    """The template reads content as a string (a list renders as nothing): the parts are joined for it, as
    vLLM's auto content format does, on chat and through the Messages API."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>skills</system-reminder>"},
                                          {"type": "text", "text": "Weather in Rome?"}]}]
    create(gw, client, "Sunny.", messages=parts)
    assert "<system-reminder>skills</system-reminder>\nWeather in Rome?<|im_end|>" in gw.last_prompt()
    from tests.gateway.conftest import http

    body = {"model": gw.model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "first block"}, {"type": "text", "text": "second block"}]}],
        "metadata": {"user_id": "u"}, "temperature": 0, "seed": gw.say("Hi.")}
    r = http("POST", gw.url + "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    assert "first block\nsecond block<|im_end|>" in gw.last_prompt()
