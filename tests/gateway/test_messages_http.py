"""/v1/messages (Anthropic's Messages API) through the anthropic SDK: the chat path's tokens in Anthropic's shapes."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from tests.gateway.conftest import http

anthropic = pytest.importorskip("anthropic")

TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"enum": ["Köln", "Berlin"]}},
                         "required": ["city"], "additionalProperties": False}}
GREEDY = {"temperature": 0}  # the SDK takes sampling settings as extra fields
OPENAI_TOOL = {"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                                "parameters": TOOL["input_schema"]}}


@pytest.fixture
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0, timeout=60) as c:
        yield c


def chat_twin(client, server, messages, chat_template_kwargs=None, **kw):
    extra = {"return_token_ids": True}
    if chat_template_kwargs:
        extra["chat_template_kwargs"] = chat_template_kwargs
    return client.chat.completions.create(model=server.model, messages=messages, temperature=0, extra_body=extra, **kw)


def post(server, path, body, headers=None):
    h = {"Content-Type": "application/json", "x-api-key": server.api_key, **(headers or {})}
    return http("POST", server.url + path, json.dumps(body).encode(), h)


def test_a_turn_is_the_chat_paths_answer_in_anthropics_shape(claude, client, server):
    m = claude.messages.create(model=server.model, max_tokens=12, extra_body=GREEDY,
                               system=[{"type": "text", "text": "You are terse."}],
                               messages=[{"role": "user", "content": "Hi there"}],
                               thinking={"type": "disabled"})
    twin = chat_twin(client, server, [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Hi there"}], max_tokens=12,
                     chat_template_kwargs={"enable_thinking": False})
    text = "".join(b.text for b in m.content if b.type == "text")
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert text == twin.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[twin.choices[0].finish_reason]
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == twin.usage.prompt_tokens
    assert m.usage.output_tokens == twin.usage.completion_tokens


def test_the_stream_carries_the_same_turn(claude, server):
    kw = dict(model=server.model, max_tokens=16, extra_body=GREEDY, messages=[{"role": "user", "content": "Count on"}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_tool_call_is_a_tool_use_block_and_its_result_goes_back(claude, client, server):
    ask = [{"role": "user", "content": "Weather in Köln?"}]
    m = claude.messages.create(model=server.model, max_tokens=64, extra_body=GREEDY, messages=ask, tools=[TOOL],
                               tool_choice={"type": "tool", "name": "get_weather"})
    calls = [b for b in m.content if b.type == "tool_use"]
    twin = chat_twin(client, server, ask, max_tokens=64, tools=[OPENAI_TOOL],
                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
    want = twin.choices[0].message.tool_calls[0]
    assert m.stop_reason == "tool_use" and len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].input == json.loads(want.function.arguments)
    follow = ask + [{"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "get_weather",
                                                       "input": calls[0].input}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                  "content": [{"type": "text", "text": "Sunny, 21 C"}]},
                                                 {"type": "text", "text": "Thanks!"}]}]
    counted = claude.messages.count_tokens(model=server.model, messages=follow, tools=[TOOL])
    chat = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(calls[0].input)}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 C"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}]
    tokenized = post(server, "/tokenize", {"messages": chat, "tools": [OPENAI_TOOL]}).json()
    assert counted.input_tokens == tokenized["count"]
    answered = claude.messages.create(model=server.model, max_tokens=4, messages=follow, tools=[TOOL])
    assert answered.usage.input_tokens + answered.usage.cache_read_input_tokens == tokenized["count"]



@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
@pytest.mark.parametrize("thinking", [{"type": "disabled"}, {"type": "enabled", "budget_tokens": 64}])
def test_count_tokens_counts_a_forced_calls_opener_as_the_turn_bills_it(claude, server, choice, thinking):
    ask = [{"role": "user", "content": "Weather in Köln?"}]
    kw = dict(model=server.model, messages=ask, tools=[TOOL], tool_choice=choice, thinking=thinking)
    counted = claude.messages.count_tokens(**kw)
    answered = claude.messages.create(max_tokens=2, extra_body=GREEDY, **kw)
    assert counted.input_tokens == answered.usage.input_tokens + answered.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_turn_and_is_named(claude, server):
    kw = dict(model=server.model, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": "Go"}],
              thinking={"type": "disabled"})
    text = "".join(b.text for b in claude.messages.create(**kw).content if b.type == "text")
    stop = text.strip()[3:6]
    assert len(stop) == 3
    m = claude.messages.create(stop_sequences=[stop], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content if b.type == "text") == text[:text.index(stop)]


@pytest.mark.parametrize("body, status, kind, where", [
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video", "source": {}}]}]}, 400,
     "invalid_request_error", "messages[0].content[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error", "tools[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["a"] * 65}, 400,
     "invalid_request_error", "stop_sequences"),
    ({"max_tokens": 4, "system": "s", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]}, 400,
     "invalid_request_error", "messages[2].content[0]"),
    ({"max_tokens": 4, "model": "claude-nope", "messages": [{"role": "user", "content": "x"}]}, 404,
     "not_found_error", "model"),
    # an empty user turn after an assistant one would have made that one a prefill
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                    {"role": "user", "content": []}]}, 400, "invalid_request_error",
     "messages[2].content"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": ""}]}, 400, "invalid_request_error",
     "messages[0].content"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
      "output_config": {"format": {"type": "json_schema"}}}, 400, "invalid_request_error", "output_config.format.schema"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, 400,
     "invalid_request_error", "output_config.format.schema"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
      "output_config": {"format": {"type": "xml", "schema": {}}}}, 400, "invalid_request_error",
     "output_config.format.type"),
    ({"max_tokens": 4, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "r"}]}]}, 400,
     "invalid_request_error", "messages[2].content[0].tool_use_id 'toolu_2'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],  # markup in a name ends the call early
      "tools": [{"name": "f\n<tool_call>", "input_schema": {"type": "object"}}]}, 400, "invalid_request_error",
     "tools[0].name"),
])
def test_bad_requests_answer_anthropic_errors(server, body, status, kind, where):
    r = post(server, "/v1/messages", body)
    assert r.status == status, r.body
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind and where in err["error"]["message"]
    assert post(server, "/v1/messages", {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}).status == 200


def test_the_key_comes_as_x_api_key_or_bearer(server):
    body = {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    wrong = post(server, "/v1/messages", body, {"x-api-key": "nope"})
    assert wrong.status == 401 and wrong.json()["error"]["type"] == "authentication_error"
    bearer = http("POST", server.url + "/v1/messages", json.dumps(body).encode(),
                  {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
    assert bearer.status == 200
    # both sent, one of them stale: the right one is enough
    assert post(server, "/v1/messages", body, {"Authorization": "Bearer stale"}).status == 200
    assert post(server, "/v1/messages", body, {"x-api-key": "stale",
                                               "Authorization": f"Bearer {server.api_key}"}).status == 200
    none = http("POST", server.url + "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert none.status == 401 and "x-api-key" in none.json()["error"]["message"]


def test_a_second_turn_reads_the_shared_system_and_tools_from_reuse_and_answers_as_cold(claude, server):
    """Claude Code's shape: a long system block list and tools, new user text each turn."""
    system = [{"type": "text", "text": " ".join(f"rule {i}: keep the build green." for i in range(150))}]
    tools = [dict(TOOL, name=f"tool_{i}", description=f"tool number {i} " * 20) for i in range(4)]
    kw = dict(model=server.model, max_tokens=8, system=system, tools=tools, extra_body=GREEDY)
    cold = claude.messages.create(messages=[{"role": "user", "content": "first question"}], **kw)
    warm = claude.messages.create(messages=[{"role": "user", "content": "second question"}], **kw)
    assert cold.usage.input_tokens > 1000
    assert warm.usage.cache_read_input_tokens >= 1000  # the system block and the tools
    again = claude.messages.create(messages=[{"role": "user", "content": "first question"}], **kw)
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in cold.content]
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == \
        cold.usage.input_tokens + cold.usage.cache_read_input_tokens
    # streamed, message_start already has the split (the engine says it at admission), as message_delta does
    with claude.messages.stream(messages=[{"role": "user", "content": "third question"}], **kw) as stream:
        start = next(e for e in stream if e.type == "message_start").message.usage
        final = stream.get_final_message().usage
    assert start.cache_read_input_tokens >= 1000 and start.output_tokens == 0
    assert (start.input_tokens, start.cache_read_input_tokens) == (final.input_tokens, final.cache_read_input_tokens)


def test_a_streamed_tool_call_arrives_as_input_json_deltas(claude, server):
    kw = dict(model=server.model, max_tokens=64, extra_body=GREEDY, tools=[TOOL],
              messages=[{"role": "user", "content": "Weather in Köln?"}],
              tool_choice={"type": "tool", "name": "get_weather"})
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert deltas and all(d.type == "input_json_delta" for d in deltas)
    assert json.loads("".join(d.partial_json for d in deltas)) == whole.content[0].input
    same = [b.model_dump(exclude={"id"}) for b in whole.content]
    assert [b.model_dump(exclude={"id"}) for b in final.content] == same
    assert final.content[0].id.startswith("toolu_") and final.stop_reason == "tool_use"


def test_anthropic_clients_list_and_retrieve_the_served_model(claude, client, server):
    page = claude.models.list()
    assert [m.id for m in page.data] == [server.model] and page.has_more is False
    assert page.first_id == page.last_id == server.model
    one = claude.models.retrieve(server.model)
    assert one.type == "model" and one.display_name == server.model and one.created_at.year >= 2024
    assert [m.id for m in client.models.list().data] == [server.model]  # OpenAI's clients read the same answer


def test_structured_outputs_hold_the_text_to_the_schema(claude, server):
    """Anthropic's structured outputs (``output_config.format``, as the SDK's ``messages.parse`` sends it, and
    the beta's ``output_format``): the text is JSON valid under the schema, also with thinking on."""
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):  # bounded, so the random model's answer ends inside max_tokens (the SDK
        item: Literal["lamp", "desk"]  # moves length and range bounds into descriptions, as Anthropic wants)
        quantity: Literal[1, 2, 3]
        rush: bool

    ask = [{"role": "user", "content": "Order two lamps"}]
    for thinking in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 8}):
        m = claude.messages.parse(model=server.model, max_tokens=200, messages=ask, output_format=Order,
                                  thinking=thinking, extra_body={"temperature": 0, "seed": 1})
        assert m.stop_reason == "end_turn", m
        assert isinstance(m.parsed_output, Order)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    r = post(server, "/v1/messages", {"max_tokens": 60, "messages": ask, "temperature": 0,
                                      "output_format": {"type": "json_schema", "schema": schema}})
    assert r.status == 200, r.body
    text = "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")
    assert set(json.loads(text)) == {"n"} and isinstance(json.loads(text)["n"], int)
