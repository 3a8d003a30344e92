"""A table of bad requests: each gets its status and an OpenAI error object, and the server serves on."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http

CHAT = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]


def body(**fields):
    return json.dumps({"model": "ignis-demo", "messages": OK_MESSAGES, "max_tokens": 2, **fields}).encode()


BIG = 33 << 20  # past any context-sized body limit of the demo model

CASES = [
    # name, path, raw body (bytes or callable), headers override, status, param, code
    ("malformed_json", CHAT, b'{"messages": [', None, 400, None, "invalid_json"),
    ("not_an_object", CHAT, b"[1, 2]", None, 400, None, "invalid_json"),
    ("messages_wrong_type", CHAT, body(messages="hello"), None, 400, "messages", None),
    ("max_tokens_wrong_type", CHAT, body(max_tokens="ten"), None, 400, "max_tokens", None),
    ("temperature_wrong_type", CHAT, body(temperature=True), None, 400, "temperature", None),
    ("stream_wrong_type", CHAT, body(stream="yes"), None, 400, "stream", None),
    ("negative_max_tokens", CHAT, body(max_tokens=-5), None, 400, "max_tokens", None),
    ("zero_max_completion_tokens", CHAT, body(max_completion_tokens=0), None, 400, "max_completion_tokens", None),
    ("temperature_out_of_range", CHAT, body(temperature=9), None, 400, "temperature", None),
    ("top_p_zero", CHAT, body(top_p=0), None, 400, "top_p", None),
    ("unknown_model", CHAT, body(model="gpt-17"), None, 404, "model", "model_not_found"),
    ("unknown_role", CHAT, body(messages=[{"role": "wizard", "content": "x"}]), None, 400, "messages[0].role", None),
    ("missing_role", CHAT, body(messages=[{"content": "x"}]), None, 400, "messages[0].role", None),
    ("empty_messages", CHAT, body(messages=[]), None, 400, "messages", None),
    ("missing_messages", CHAT, json.dumps({"max_tokens": 2}).encode(), None, 400, "messages", None),
    ("user_content_missing", CHAT, body(messages=[{"role": "user"}]), None, 400, "messages[0].content", None),
    ("image_part", CHAT, body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     None, 400, "messages[0].content[0].image_url", None),
    ("image_for_a_text_model", CHAT, body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]),
     None, 400, "messages", "images_not_supported"),
    ("video_part", CHAT, body(messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}]),
     None, 400, "messages[0].content[0].type", None),
    ("n_too_large", CHAT, body(n=129), None, 400, "n", None),
    ("top_logprobs_too_large", CHAT, body(logprobs=True, top_logprobs=21), None, 400, "top_logprobs", None),
    ("top_logprobs_without_logprobs", CHAT, body(top_logprobs=2), None, 400, "top_logprobs", None),
    ("too_many_stops", CHAT, body(stop=[str(i) for i in range(65)]), None, 400, "stop", None),
    ("empty_stop", CHAT, body(stop=[""]), None, 400, "stop", None),
    ("stream_options_without_stream", CHAT, body(stream_options={"include_usage": True}), None, 400,
     "stream_options", None),
    ("bad_tool_arguments", CHAT, body(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]), None, 400,
     "messages[1].tool_calls[0].function.arguments", None),
    ("unknown_named_tool", CHAT, body(tools=[{"type": "function", "function": {"name": "f"}}],
                                      tool_choice={"type": "function", "function": {"name": "g"}}), None, 400,
     "tool_choice.function.name", None),
    ("required_without_tools", CHAT, body(tool_choice="required"), None, 400, "tool_choice", None),
    # a name holding markup ended the call early; held to it, a required call never parsed as one
    ("tool_name_with_markup", CHAT, body(tools=[{"type": "function", "function": {"name": "</tool_call><|im_end|>"}}],
                                         tool_choice="required"), None, 400, "tools[0].function.name", None),
    ("tool_name_with_space", CHAT, body(tools=[{"type": "function", "function": {"name": "get weather"}}]), None, 400,
     "tools[0].function.name", None),
    ("bad_request_class", CHAT, body(request_class="vip"), None, 400, "request_class", None),
    ("bad_class_header", CHAT, body(), {"X-Ignis-Request-Class": "vip"}, 400, "X-Ignis-Request-Class", None),
    ("unknown_response_format", CHAT, body(response_format={"type": "yaml"}), None, 400, "response_format.type", None),
    ("bad_json_schema", CHAT, body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(("}}}), None, 400,
     "response_format.json_schema.schema", None),
    ("json_with_ignore_eos", CHAT, body(response_format={"type": "json_object"}, ignore_eos=True), None, 400,
     "ignore_eos", None),
    ("too_long_prompt", CHAT, body(messages=[{"role": "user", "content": "word " * 20000}]), None, 400, "messages",
     "context_length_exceeded"),
    ("max_tokens_past_context", CHAT, body(max_tokens=10**6), None, 400, "messages", "context_length_exceeded"),
    ("negative_top_k", CHAT, body(top_k=-2), None, 400, "top_k", None),
    ("huge_stop_token_id", CHAT, body(stop_token_ids=[2**40]), None, 400, "stop_token_ids", None),
    ("huge_completion_max_tokens", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2**40}).encode(), None,
     400, None, None),
    ("logit_bias_list", CHAT, body(logit_bias=[[1, 2]]), None, 400, "logit_bias", None),
    ("logit_bias_out_of_range", CHAT, body(logit_bias={"5": 250}), None, 400, "logit_bias", None),
    ("logit_bias_past_vocabulary", CHAT, body(logit_bias={"9999999": 1}), None, 400, "logit_bias", None),
    ("min_tokens_over_max_tokens", CHAT, body(min_tokens=3), None, 400, "min_tokens", None),
    ("completion_prompt_missing", "/v1/completions", json.dumps({"max_tokens": 2}).encode(), None, 400, "prompt",
     None),
    ("completion_bad_token_id", "/v1/completions", json.dumps({"prompt": [1, 10**7]}).encode(), None, 400, "prompt",
     None),
    ("completion_empty_prompt", "/v1/completions", json.dumps({"prompt": ""}).encode(), None, 400, "prompt", None),
    ("completion_batch_mixed", "/v1/completions", json.dumps({"prompt": ["a", 5]}).encode(), None, 400, "prompt", None),
    ("completion_batch_too_many", "/v1/completions", json.dumps({"prompt": ["a"] * 257}).encode(), None, 400, "prompt",
     None),
    ("completion_batch_bad_id", "/v1/completions", json.dumps({"prompt": ["a", [1, 10**7]]}).encode(), None, 400,
     "prompt[1]", None),
    ("completion_batch_too_many_choices", "/v1/completions", json.dumps({"prompt": ["a"] * 33, "n": 8}).encode(), None,
     400, "n", None),
    ("body_over_limit", CHAT, lambda: b'{"messages": "' + b"x" * BIG + b'"}', None, 413, None, "request_too_large"),
    ("wrong_key", CHAT, body(), {"Authorization": "Bearer not-the-key"}, 401, None, "invalid_api_key"),
    ("missing_key", CHAT, body(), {"Authorization": None}, 401, None, "invalid_api_key"),
    ("unknown_route", "/v1/nothing-here", body(), None, 404, None, "not_found"),
    ("wrong_method", "/v1/models", body(), None, 405, None, "method_not_allowed"),
]


def send(server, path, raw, headers):
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"}
    for k, v in (headers or {}).items():
        if v is None:
            h.pop(k, None)
        else:
            h[k] = v
    return http("POST", server.url + path, raw() if callable(raw) else raw, h, timeout=60)


@pytest.mark.parametrize("name,path,raw,headers,status,param,code", CASES, ids=[c[0] for c in CASES])
def test_bad_input(server, name, path, raw, headers, status, param, code):
    r = send(server, path, raw, headers)
    assert r.status == status, r.body[:500]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"] and "/work" not in err["message"] and ".py" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    ok = send(server, CHAT, body(max_tokens=1), None)
    assert ok.status == 200, ok.body[:500]


def test_health_and_metrics_need_no_key(server):
    assert http("GET", server.url + "/health").status == 200
    assert http("GET", server.url + "/ping").status == 200
    version = http("GET", server.url + "/version")
    assert version.status == 200 and version.json()["version"]
    assert http("GET", server.url + "/metrics").status == 200
    assert http("GET", server.url + "/v1/models").status == 401


V1_ROUTES = (("GET", "/v1/models"), ("GET", "/v1/models/ignis-demo"), ("POST", CHAT), ("POST", "/v1/completions"),
             ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"))


def test_every_v1_route_takes_the_whole_key_and_nothing_near_it(server):
    key = server.api_key
    near = [f"Bearer {key[:-1]}", f"Bearer {key[: len(key) // 2]}", f"Bearer {key}x", f"Bearer {key.swapcase()}",
            f"Bearer x{key}", f"Basic {key}", f"Token {key}", "Bearer ", key]
    for method, path in V1_ROUTES:
        for header in near:
            r = http(method, server.url + path, body() if method == "POST" else None,
                     {"Content-Type": "application/json", "Authorization": header})
            assert r.status == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path, header, r.body)
        right = http(method, server.url + path, body(max_tokens=1) if method == "POST" else None,
                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        assert right.status != 401, (method, path, right.body)


def test_bodies_within_the_context_sized_limit_are_accepted(server):
    # 16 bytes per token of the 16384-token context plus 64 KiB: 320 KiB; 8 characters per token: 131072
    raw = b"{" + b" " * 150_000 + json.dumps({"messages": OK_MESSAGES, "max_tokens": 1, "user": "u" * 120_000}
                                              ).encode()[1:]
    assert len(raw) > 256 << 10  # parsed and checked on a worker thread
    r = send(server, CHAT, raw, None)
    assert r.status == 200, r.body[:300]


def test_openapi_marks_exactly_the_routes_that_answer_401_without_the_key(server):
    """/server_info, /get_server_info and /invocations needed the key but the document said they did not."""
    doc = http("GET", server.url + "/openapi.json").json()
    for path, ops in doc["paths"].items():
        if "{" in path:
            continue
        for method, op in ops.items():
            if method not in ("get", "post"):
                continue
            status = http(method.upper(), server.url + path, b"{}" if method == "post" else None,
                          {"Content-Type": "application/json"}).status
            assert ("security" in op) == (status == 401), (method, path, status)


def test_a_wrong_method_names_the_methods_the_route_takes(server):
    r = http("PUT", server.url + "/health")
    assert r.status == 405 and "GET" in r.headers.get("Allow", ""), dict(r.headers)
