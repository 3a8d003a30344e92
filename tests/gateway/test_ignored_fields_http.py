"""Request fields nothing reads are reported (log once, metric, done line); every field ignis takes is read.

A gateway on the official Qwen3.5 template in front of the scripted engine
(``fake_engine``): each field of each generation endpoint's request schema
(``gateway.request_schemas``, what /openapi.json publishes) is sent alone with
a valid value, and the engine's ``Generate.notes`` must not call it ignored;
an unknown field is reported on every endpoint, and the fields accepted on
purpose (``ignored_fields.ACCEPTED``) are not.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.ignored_fields import ACCEPTED
from ignis.gateway.request_schemas import CHAT_COMPLETIONS, COMPLETIONS, MESSAGES, RESPONSES, SAMPLING
from tests.gateway.conftest import http
from tests.gateway.tools_http_support import tools_gateway

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

COMMON = {
    "model": {}, "stream": {"stream": True}, "n": {"n": 2}, "stop": {"stop": ["zz"]}, "stop_token_ids": {"stop_token_ids": [7]},
    "max_tokens": {"max_tokens": 5}, "temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9}, "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1}, "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5}, "repetition_penalty": {"repetition_penalty": 1.1},
    "seed": {}, "ignore_eos": {"ignore_eos": True}, "return_token_ids": {"return_token_ids": True},
    "request_class": {"request_class": "interactive"}, "priority": {"priority": 1},
    "prompt_cache_key": {"prompt_cache_key": "k"}, "cache_salt": {"cache_salt": "salt"},
    "request_id": {"request_id": "my-id-1"}, "logit_bias": {"logit_bias": {"5": 1.0}},
    "min_tokens": {"min_tokens": 1}, "prompt_logprobs": {"prompt_logprobs": 1},
    "allowed_token_ids": {"allowed_token_ids": [5, 6, 7]}, "bad_words": {"bad_words": ["zebra"]},
    "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "skip_special_tokens": {"skip_special_tokens": False},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": False},
    "return_tokens_as_token_ids": {"return_tokens_as_token_ids": True},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 4000},
    "structured_outputs": {"structured_outputs": {"regex": "[a-z]+"}}, "guided_json": {"guided_json": SCHEMA},
    "guided_regex": {"guided_regex": "[a-z]+"}, "guided_choice": {"guided_choice": ["yes", "no"]},
    "guided_grammar": {"guided_grammar": 'start: "yes"'},
}
"""Per field of ``SAMPLING``: the fields a request sends to use it (its companions too)."""

CHAT = {
    **COMMON, "messages": {},
    "max_completion_tokens": {"max_completion_tokens": 5},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "logprobs": {"logprobs": True}, "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "tools": {"tools": [TOOL]}, "tool_choice": {"tools": [TOOL], "tool_choice": "required"},
    "response_format": {"response_format": {"type": "json_object"}},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": False},
    "continue_final_message": {"continue_final_message": True, "add_generation_prompt": False,
                               "messages": [{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello"}]},
    "add_generation_prompt": {"add_generation_prompt": True},
    "thinking_token_budget": {"thinking_token_budget": 10}, "reasoning_effort": {"reasoning_effort": "low"},
    "include_reasoning": {"include_reasoning": False},
    "echo": {"echo": True, "continue_final_message": True, "add_generation_prompt": False,
             "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
}
COMPLETION = {
    **COMMON, "prompt": {}, "logprobs": {"logprobs": 1}, "echo": {"echo": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
}
RESPONSE = {
    "model": {}, "input": {}, "instructions": {"instructions": "Be brief."}, "previous_response_id": {},
    "max_output_tokens": {"max_output_tokens": 5}, "temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9},
    "seed": {}, "stream": {"stream": True}, "store": {"store": False},
    "parallel_tool_calls": {"parallel_tool_calls": False}, "background": {},
    "truncation": {"truncation": "auto"}, "top_logprobs": {"top_logprobs": 2},
    "tools": {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
    "tool_choice": {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                    "tool_choice": "auto"},
    "reasoning": {"reasoning": {"effort": "low"}}, "text": {"text": {"format": {"type": "json_object"}}},
    "metadata": {"metadata": {"k": "v"}}, "include": {"include": ["message.output_text.logprobs"]},
    "max_tool_calls": {"max_tool_calls": 2}, "prompt_cache_key": {"prompt_cache_key": "k"},
    "cache_salt": {"cache_salt": "salt"},
}
MESSAGE = {
    "model": {}, "max_tokens": {}, "messages": {}, "system": {"system": "Be brief."},
    "stop_sequences": {"stop_sequences": ["zz"]}, "temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9},
    "top_k": {"top_k": 5}, "stream": {"stream": True},
    "tools": {"tools": [{"name": "f", "input_schema": {"type": "object"}}]},
    "tool_choice": {"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}},
    "thinking": {"thinking": {"type": "enabled", "budget_tokens": 10}},
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5")


def _post(gw, path: str, body: dict) -> tuple[int, str]:
    body = {"seed": gw.say("Fine."), **body}
    r = http("POST", gw.url + path, json.dumps({"model": gw.model, **body}).encode(),
             {"Content-Type": "application/json"})
    return r.status, r.body.decode()


def _notes(gw) -> str:
    return gw.engine.generates[-1].notes or ""


ENDPOINTS = [
    ("/v1/chat/completions", "chat", CHAT_COMPLETIONS, CHAT, {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", "completions", COMPLETIONS, COMPLETION, {"prompt": "Hi"}),
    ("/v1/responses", "responses", RESPONSES, RESPONSE, {"input": "Hi"}),
    ("/v1/messages", "messages", MESSAGES, MESSAGE,
     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}),
]


@pytest.mark.parametrize("path,endpoint,schema,uses,base", ENDPOINTS, ids=[e[1] for e in ENDPOINTS])
def test_every_field_of_the_published_schema_is_read(gw, path, endpoint, schema, uses, base):
    assert set(uses) == set(schema["properties"]), "a field of the schema without a use here (or the reverse)"
    for name, fields in uses.items():
        status, body = _post(gw, path, {**base, **fields})
        assert status == 200, (name, body)
        assert "ignored fields" not in _notes(gw), (name, _notes(gw))


def test_sampling_fields_are_the_same_on_both_endpoints():
    assert set(SAMPLING) <= set(CHAT) and set(SAMPLING) <= set(COMPLETION)


def _ignored_count(gw, endpoint: str) -> float:
    text = http("GET", gw.url + "/metrics").body.decode()
    line = f'ignis:gateway_request_fields_ignored_total{{endpoint="{endpoint}",model_name="{gw.model}"}}'
    alt = f'ignis:gateway_request_fields_ignored_total{{model_name="{gw.model}",endpoint="{endpoint}"}}'
    return float(next((x.split()[-1] for x in text.splitlines() if x.startswith((line, alt))), "0"))


@pytest.mark.parametrize("path,endpoint,schema,uses,base", ENDPOINTS, ids=[e[1] for e in ENDPOINTS])
def test_an_unknown_field_is_answered_and_reported_once_in_the_log_each_time_in_the_done_line(
        gw, path, endpoint, schema, uses, base):
    name = f"max_tokenz_{endpoint}"
    before = _ignored_count(gw, endpoint)
    for _ in range(2):
        status, body = _post(gw, path, {**base, name: 3})
        assert status == 200, body
        assert f"ignored fields: {name}" in _notes(gw)
    assert _ignored_count(gw, endpoint) == before + 2
    assert gw.log().count(repr(name)) == 1  # warned once, counted and noted every time
    # the fields accepted on purpose say nothing
    for accepted in ACCEPTED[endpoint]:
        value = {"k": "v"} if accepted == "metadata" else (False if accepted == "store" else "x")
        if accepted == "stream_options":
            value = {"include_obfuscation": False}
        status, body = _post(gw, path, {**base, accepted: value})
        assert status == 200, (accepted, body)
        assert "ignored fields" not in _notes(gw), (accepted, _notes(gw))
    assert _ignored_count(gw, endpoint) == before + 2


def test_a_name_that_is_no_plain_text_is_shown_escaped_and_cut(gw):
    long = "x" * 500
    _post(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "bad\nname": 1, long: 1})
    notes = _notes(gw)
    assert "bad\\nname" in notes and "x" * 61 + "..." in notes and "x" * 62 not in notes


def test_a_body_of_many_unknown_fields_is_one_short_warning(gw):
    fields = {f"junk_field_{i}": i for i in range(300)}
    status, body = _post(gw, "/v1/completions", {"prompt": "Hi", **fields})
    assert status == 200, body
    assert len(_notes(gw)) <= 1024 and _notes(gw).startswith("ignored fields: junk_field_0, junk_field_1")
    [line] = [x for x in gw.log().splitlines() if "'junk_field_0'" in x]
    assert "'junk_field_7' ignored (of 300 ignored in this request)" in line and len(line) < 1000
    # the next request's new names are still warned about: junk does not silence the warning
    _post(gw, "/v1/completions", {"prompt": "Hi", "max_tokenss": 3})
    assert "'max_tokenss'" in gw.log()


def test_a_spelling_that_lost_to_another_is_not_reported(gw):
    for path, body, headers in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                      "max_completion_tokens": 4}, {}),
            ("/v1/completions", {"prompt": "Hi", "request_class": "agent", "priority": 3}, {}),
            ("/v1/completions", {"prompt": "Hi", "request_id": "body-id"}, {"X-Request-Id": "header-id"})):
        body = {"model": gw.model, "seed": gw.say("Fine."), **body}
        r = http("POST", gw.url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
        assert r.status == 200, r.body
        assert "ignored fields" not in _notes(gw), (body, _notes(gw))


def test_warned_names_are_bounded_and_forgotten_after_a_while():
    from ignis.gateway import metrics as m

    now = [0.0]
    names = m._WarnedNames(clock=lambda: now[0])
    assert all(names.first(i) for i in range(m.MAX_WARNED_NAMES))
    assert not names.first("typo") and not names.first(0)  # full: counted elsewhere, not logged
    now[0] += m.WARNED_RESET_S
    assert names.first("typo") and not names.first("typo")


def test_a_refused_request_reports_nothing_and_a_losing_format_spelling_is_not_ignored(gw):
    before = _ignored_count(gw, "messages")
    base = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    status, body = _post(gw, "/v1/messages", {**base, "tool_choice": {"type": "bogus"}, "junk_x": 1})
    assert status == 400, body
    assert _ignored_count(gw, "messages") == before  # the request was not answered: nothing to report
    fmt = {"type": "json_schema", "schema": {"type": "object"}}
    status, body = _post(gw, "/v1/messages", {**base, "output_config": {"format": fmt}, "output_format": fmt})
    assert status == 200, body
    assert "ignored fields" not in _notes(gw), _notes(gw)
    status, body = _post(gw, "/v1/responses", {"input": "Hi", "client_metadata": {"session": "s"}})
    assert status == 200 and "ignored fields" not in _notes(gw), (body, _notes(gw))  # Codex's, every turn
