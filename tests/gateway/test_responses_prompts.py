"""/v1/responses under the official Qwen3.5 template, in front of a scripted engine (``fake_engine``).

The engine answers each request with a scripted text (its seed picks it), so
what is tested is the gateway: the prompt the Responses input renders to, and
the items, events and errors that come back, through the openai client and as
raw SSE.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.conftest import http
from tests.gateway.responses_support import check_events, collapsed, item_events, raw_events
from tests.gateway.test_tools_http_qwen3_5 import xml_call
from tests.gateway.tools_http_support import holds, tools_gateway, vocab  # noqa: F401 (vocab: a fixture)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}
CRM = {"type": "namespace", "name": "crm", "description": "The customer database", "tools": [
    {"type": "function", "name": "lookup", "description": "Find a customer",
     "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}}]}
HOSTED = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
          {"type": "code_interpreter", "container": {"type": "auto"}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
THINK = {"effort": "high", "summary": "auto"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5")


@pytest.fixture(scope="module")
def client(gw):
    with gw.client() as c:
        yield c


def create(gw, client, answer: str, extra_body: dict | None = None, **kwargs):
    """A response the engine answers with ``answer``."""
    return client.responses.create(model=gw.model, extra_body={"seed": gw.say(answer), **(extra_body or {})},
                                   **kwargs)


def post(gw, body: dict):
    return http("POST", gw.url + "/v1/responses", json.dumps({"model": gw.model, **body}).encode(),
                {"Content-Type": "application/json"})


def test_metadata_past_openais_bounds_is_a_400(gw):
    # stored and echoed, it held whatever a client sent: 1,000 keys of 500 characters were taken
    for metadata, fragment in (({f"k{i}": "v" for i in range(17)}, "at most 16"), ({"k" * 65: "v"}, "64 characters"),
                               ({"k": "v" * 513}, "512 characters"), ({"k": 5}, "must be a string")):
        r = post(gw, {"input": "hi", "metadata": metadata})
        assert r.status == 400 and fragment in r.json()["error"]["message"], r.body
        assert r.json()["error"]["param"].startswith("metadata"), r.body
    assert post(gw, {"input": "hi", "metadata": {f"k{i}": "v" * 512 for i in range(16)}}).status == 200


def test_plain_text_turn(gw, client):
    r = create(gw, client, "Sunny.", input="Weather in Paris?", instructions="Be brief.", metadata={"k": "v"})
    assert gw.last_prompt().startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris?")
    assert r.status == "completed" and r.output_text == "Sunny." and r.metadata == {"k": "v"}
    assert [i.type for i in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == len(gw.last_prompt_ids()) and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_reasoning_text_and_two_calls_streamed_in_order(gw, client):
    text = "Two lookups.\n</think>\n\nChecking.\n" + xml_call("get_weather", city="Paris", days="2") + "\n" + \
        xml_call("get_weather", city="Oslo")
    body = {"model": gw.model, "input": ASK, "tools": [WEATHER], "reasoning": THINK, "seed": gw.say(text)}
    events = raw_events(gw.url, body)
    check_events(events)
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n")
    added, done = "response.output_item.added", "response.output_item.done"
    call = [added, "response.function_call_arguments.delta", "response.function_call_arguments.done", done]
    assert collapsed(item_events(events)) == [
        added, "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", done,
        added, "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", done, *call, *call]
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed"
    kinds = [i["type"] for i in final["output"]]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": "Two lookups.\n"}]
    assert final["output"][1]["content"][0]["text"] == "Checking.\n"
    calls = final["output"][2:]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris", "days": 2}, {"city": "Oslo"}]
    assert calls[0]["call_id"] != calls[1]["call_id"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    types = [t for t, _ in events]
    # the client's own stream parses the same events into its models
    seen = [e.type for e in client.responses.create(stream=True, input=ASK, tools=[WEATHER], reasoning=THINK,
                                                    model=gw.model, extra_body={"seed": gw.say(text)})]
    assert collapsed(seen) == collapsed(types)


def test_parallel_tool_calls_false_answers_the_first_call(gw, client, vocab):
    text = xml_call("get_weather", city="Paris") + "\n" + xml_call("get_weather", city="Oslo")
    r = create(gw, client, text, input=ASK, tools=[WEATHER], parallel_tool_calls=False)
    assert [json.loads(i.arguments) for i in r.output] == [{"city": "Paris"}]
    # a required call is one call then: its grammar ends after it (more would be generated, billed, dropped)
    create(gw, client, text.removeprefix("<tool_call>\n"), input=ASK, tools=[WEATHER], parallel_tool_calls=False,
           tool_choice="required")
    grammar = gw.engine.generates[-1].grammar
    assert holds(vocab, grammar, xml_call("get_weather", city="Paris").removeprefix("<tool_call>\n"))
    assert not holds(vocab, grammar, text.removeprefix("<tool_call>\n"))


def test_namespace_tools_flattened_and_mapped_back_hosted_tools_left_out(gw, client):
    before = http("GET", gw.url + "/metrics").body.decode()
    r = create(gw, client, xml_call("crm__lookup", email="a@b.c"), input=ASK, tools=[WEATHER, CRM, *HOSTED])
    prompt = gw.last_prompt()
    assert '"name": "crm__lookup"' in prompt and '"name": "get_weather"' in prompt
    assert "web_search" not in prompt and "vector_store" not in prompt
    [call] = r.output
    assert (call.type, call.name, call.namespace, json.loads(call.arguments)) == (
        "function_call", "lookup", "crm", {"email": "a@b.c"})
    after = http("GET", gw.url + "/metrics").body.decode()
    line = 'ignis:gateway_responses_tools_ignored_total{model_name="qwen3_5",tool="web_search"}'

    def count(text: str) -> float:
        return float(next((x.split()[-1] for x in text.splitlines() if x.startswith(line)), "0"))

    assert count(after) == count(before) + 1
    create(gw, client, "Again.", input=ASK, tools=[WEATHER, *HOSTED])
    assert count(http("GET", gw.url + "/metrics").body.decode()) == count(before) + 2
    assert gw.log().count("tool type 'web_search' left out") == 1  # said once, counted each time
    assert "tool 'web_search' left out" in gw.engine.generates[-1].notes  # and named in each done line
    # the call goes back as a namespaced function_call item and renders under its flat name
    history = ASK + [{"type": "function_call", "call_id": call.call_id, "name": "lookup", "namespace": "crm",
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id, "output": "vip"}]
    create(gw, client, "Found.", input=history, tools=[CRM])
    assert "<function=crm__lookup>\n<parameter=email>\na@b.c\n</parameter>" in gw.last_prompt()
    assert "<tool_response>\nvip\n</tool_response>" in gw.last_prompt()


def test_named_tool_choice_forces_the_call(gw, client):
    r = create(gw, client, "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>", input=ASK,
               tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    assert gw.last_prompt().endswith("<tool_call>\n<function=get_weather>\n")
    assert [(i.name, json.loads(i.arguments)) for i in r.output] == [("get_weather", {"city": "Oslo"})]


def test_two_developer_messages_follow_the_developer_policy(gw, client):
    messages = [{"role": "developer", "content": "You are Codex."}, {"role": "developer", "content": "Skills: none."},
                {"role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"},
                                             {"type": "input_text", "text": "hi"}]}]
    create(gw, client, "Hello.", input=messages)
    assert gw.last_prompt().startswith(
        "<|im_start|>system\nYou are Codex.<|im_end|>\n<|im_start|>user\nDeveloper instructions:\nSkills: none."
        "<|im_end|>\n<|im_start|>user\n<environment_context/>hi<|im_end|>\n")


def test_instructions_as_an_item_array_lead_the_prompt_and_are_echoed(gw, client):
    lead = [{"role": "system", "content": "Be brief."},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use metric units."}]}]
    r = create(gw, client, "Sunny.", input="Weather in Paris?", instructions=lead)
    assert gw.last_prompt().startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nDeveloper instructions:\nUse metric units."
        "<|im_end|>\n<|im_start|>user\nWeather in Paris?"), gw.last_prompt()
    assert r.output_text == "Sunny." and [getattr(m, "role", None) for m in r.instructions] == ["system", "developer"]
    follow = create(gw, client, "Windy.", input="And Oslo?", previous_response_id=r.id)
    assert follow.output_text == "Windy." and "Be brief." not in gw.last_prompt()  # not carried over


def test_prompt_cache_key_reaches_the_engine_as_a_family_digest(gw, client):
    create(gw, client, "Sunny.", input="Weather in Paris?", prompt_cache_key="codex-session-7")
    family = gw.engine.generates[-1].cache_family
    assert family is not None and "codex-session-7" not in family
    create(gw, client, "Windy.", input="And Oslo?", prompt_cache_key="codex-session-7")
    assert gw.engine.generates[-1].cache_family == family
    create(gw, client, "Calm.", input="And Rome?")
    assert gw.engine.generates[-1].cache_family is None


def test_reasoning_round_trip_through_an_encrypted_blob(gw, client):
    text = "The secret plan.\n</think>\n\n" + xml_call("get_weather", city="Paris")
    r = create(gw, client, text, input=ASK, tools=[WEATHER], reasoning=THINK, store=False,
               include=["reasoning.encrypted_content"])
    reasoning, call = r.output
    blob = reasoning.encrypted_content
    assert blob and "secret" not in blob
    assert reasoning.summary[0].text == "The secret plan.\n"
    history = ASK + [{"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": blob},
                     {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]
    create(gw, client, "It is 21 C.", input=history, tools=[WEATHER], reasoning=THINK, store=False)
    assert ("<|im_start|>assistant\n<think>\nThe secret plan.\n</think>\n\n<tool_call>\n<function=get_weather>"
            in gw.last_prompt())
    for bad in (blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB"), "ig1.bm9wZQ==", "plain text"):
        tampered = [dict(history[1], encrypted_content=bad)]
        reply = post(gw, {"input": ASK + tampered + history[2:], "tools": [WEATHER]})
        assert reply.status == 400, reply.body
        assert reply.json()["error"]["param"] == "input[1].encrypted_content", reply.json()


def test_previous_response_id_continues_a_stored_conversation(gw, client):
    first = create(gw, client, "Let me check.\n</think>\n\n" + xml_call("get_weather", city="Rome"),
                   input=ASK, tools=[WEATHER], reasoning=THINK, instructions="First instructions.")
    call = first.output[-1]
    assert http("GET", gw.url + f"/v1/responses/{first.id}").json()["id"] == first.id
    second = create(gw, client, "Done.\n</think>\n\nWarm.", previous_response_id=first.id, tools=[WEATHER],
                    reasoning=THINK, input=[{"type": "function_call_output", "call_id": call.call_id, "output": "30 C"}])
    prompt = gw.last_prompt()
    assert "First instructions." not in prompt and "Weather in Paris?" in prompt
    assert "<think>\nLet me check.\n</think>\n\n<tool_call>\n<function=get_weather>" in prompt
    assert "<tool_response>\n30 C\n</tool_response>" in prompt
    assert second.previous_response_id == first.id and second.output_text == "Warm."
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=gw.model, previous_response_id="resp_nope", input="x")
    assert e.value.body["param"] == "previous_response_id" and "resp_nope" in e.value.body["message"]
    unstored = create(gw, client, "x", input="hi", store=False)
    assert post(gw, {"previous_response_id": unstored.id, "input": "more"}).status == 404
    assert http("DELETE", gw.url + f"/v1/responses/{first.id}").json()["deleted"] is True
    assert http("GET", gw.url + f"/v1/responses/{first.id}").status == 404
    assert post(gw, {"previous_response_id": first.id, "input": "more"}).status == 404


def test_max_output_tokens_is_incomplete(gw, client):
    r = create(gw, client, "one two three four five six seven", input="count", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    events = raw_events(gw.url, {"model": gw.model, "input": "count", "max_output_tokens": 3,
                                 "seed": gw.say("one two three four five six seven")})
    check_events(events)
    assert events[-1][0] == "response.incomplete"


def test_engine_failure_mid_stream_is_response_failed(gw, client):
    events = raw_events(gw.url, {"model": gw.model, "input": "hi", "seed": 5})
    check_events(events)
    assert events[-1][0] == "response.failed"
    assert events[-1][1]["response"]["error"]["code"] == "server_error"


def test_text_format_json_schema_goes_through_the_grammar(gw, client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = create(gw, client, '{"n": 3}', input="a number", text={"format": {"type": "json_schema", "name": "num",
                                                                          "schema": schema, "strict": True}})
    assert gw.engine.generates[-1].grammar and json.loads(r.output_text) == {"n": 3}
    bad = post(gw, {"input": "x", "text": {"format": {"type": "json_schema", "name": "b",
                                                      "schema": {"type": "no-such-type"}}}})
    assert bad.status == 400 and bad.json()["error"]["param"].startswith("text.format"), bad.json()


def test_reasoning_effort_none_closes_the_think_block(gw, client):
    create(gw, client, "ok", input="hi", reasoning={"effort": "none"})
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


BAD = [
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "web_search_call"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role", "robot"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input", "takes no images"),
    ({"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type", "user messages only"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].image_url", "file_id images are not supported"),
    ({"input": ASK + [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[1].call_id",
     "call_x"),
    ({"input": ASK + [{"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{nope"}]},
     "input[1].arguments", "not valid JSON"),
    ({"input": ASK + [{"type": "function_call", "call_id": "c", "name": "get_weather",
                       "arguments": '{"\\udc00": 1}'}]}, "input[1].arguments", "lone UTF-16 surrogate"),
    ({"input": 7}, "input", "string"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "launch"}}, "tool_choice.name",
     "launch"),
    ({"input": [{"role": "system", "content": "s"}]}, "input", "No user query"),
    ({"input": "x", "instructions": 3}, "instructions", "string or an array"),
    ({"input": "x", "instructions": [{"type": "item_reference", "id": "x"}]}, "instructions[0].type",
     "item_reference"),
]


@pytest.mark.parametrize("body,param,words", BAD)
def test_bad_items_are_400_naming_the_field(gw, client, body, param, words):
    reply = post(gw, body)
    assert reply.status == 400, reply.body
    err = reply.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_unknown_client_fields_are_ignored_and_openapi_lists_the_route(gw, client):
    r = create(gw, client, "ok", input="hi", prompt_cache_key="session-1",
               extra_body={"client_metadata": {"x": 1}, "user": "u"})
    assert r.output_text == "ok"
    doc = http("GET", gw.url + "/openapi.json").json()
    assert "post" in doc["paths"]["/v1/responses"] and "post" in doc["paths"]["/v1/chat/completions"]
    assert "get" in doc["paths"]["/v1/responses/{response_id}"]
