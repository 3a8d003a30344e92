"""POST /tokenize and /detokenize on the demo server: the ids a completion or a chat request would send."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Köln?"}]


def post(server, path, body, key=True):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    return http("POST", server.url + path, json.dumps(body).encode(), headers)


def test_a_prompt_tokenizes_as_completions_do_and_detokenizes_back(server, client, demo_tokenizer):
    text = "In the beginning there was a small village by the sea"
    r = post(server, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert r.status == 200, r.body
    got = r.json()
    assert got["tokens"] == demo_tokenizer.encode(text, add_special_tokens=True)
    assert got["count"] == len(got["tokens"]) and got["max_model_len"] == 16384
    assert got["token_strs"] == [demo_tokenizer.tokenizer.id_to_token(t) for t in got["tokens"]]
    done = client.completions.create(model=server.model, prompt=text, max_tokens=1,
                                     extra_body={"return_token_ids": True})
    assert done.model_extra["prompt_token_ids"] == got["tokens"] and done.usage.prompt_tokens == got["count"]
    back = post(server, "/detokenize", {"tokens": got["tokens"]})
    assert back.status == 200 and back.json() == {"prompt": text}


def test_messages_count_the_prompt_a_chat_request_sends(server, client):
    r = post(server, "/tokenize", {"model": server.model, "messages": MESSAGES, "tools": TOOLS})
    assert r.status == 200, r.body
    ids = r.json()["tokens"]
    done = client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS, max_tokens=1,
                                          extra_body={"return_token_ids": True})
    assert done.model_extra["prompt_token_ids"] == ids and done.usage.prompt_tokens == len(ids)
    bare = post(server, "/tokenize", {"messages": MESSAGES, "tools": TOOLS, "add_generation_prompt": False})
    history = bare.json()["tokens"]
    assert len(history) < len(ids) and ids[:len(history)] == history
    off = post(server, "/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}})
    on = post(server, "/tokenize", {"messages": MESSAGES})
    assert off.status == 200 and off.json()["tokens"] != on.json()["tokens"]


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, "messages"),
    ("/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"},  # refused as the chat path refuses it
                                {"role": "tool", "content": "42", "tool_call_id": "call_9"}]}, "messages[1]"),
    ("/tokenize", {"prompt": "x", "model": "gpt-17"}, "model"),
    ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
    ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_bodies_are_400s_and_the_server_serves_on(server, path, body, param):
    r = post(server, path, body)
    assert r.status in (400, 404), r.body
    assert r.json()["error"]["param"] == param
    assert post(server, "/tokenize", {"prompt": "still here"}).status == 200


def test_the_api_key_guards_both(server):
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        assert post(server, path, body, key=False).status == 401
