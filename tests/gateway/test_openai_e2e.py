"""The official openai client against `ignis serve` on the demo model: both endpoints, both modes."""

from __future__ import annotations

import json
import time

import pytest

from tests.gateway.conftest import http

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me about the weather today."}]
GREEDY = dict(temperature=0, max_tokens=24, extra_body={"ignore_eos": True, "return_token_ids": True})


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model] == ["ignis-demo"]
    assert http("GET", server.url + "/health").status == 200
    assert client.models.retrieve("ignis-demo").id == "ignis-demo"


def test_chat_non_streaming(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, **GREEDY)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    ids = choice.model_extra["token_ids"]
    assert len(ids) == 24 and r.usage.completion_tokens == 24
    assert r.usage.prompt_tokens == len(r.model_extra["prompt_token_ids"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)


def test_chat_stream_equals_non_stream(client, server):
    full = client.chat.completions.create(model=server.model, messages=MESSAGES, **GREEDY)
    stream = client.chat.completions.create(model=server.model, messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert text == full.choices[0].message.content
    assert ids == full.choices[0].model_extra["token_ids"]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 24
    assert usage.usage.prompt_tokens_details.cached_tokens >= 0
    assert all(c.usage is None for c in chunks[:-1])


def test_no_usage_chunk_unless_asked(client, server):
    chunks = list(client.chat.completions.create(model=server.model, messages=MESSAGES, stream=True,
                                                 max_tokens=3, temperature=0))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_completions_both_modes(client, server):
    prompt = "Once upon a time"
    r = client.completions.create(model=server.model, prompt=prompt, temperature=0, max_tokens=16,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16
    chunks = list(client.completions.create(model=server.model, prompt=prompt, temperature=0, max_tokens=16,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    ids = r.model_extra["prompt_token_ids"]
    by_ids = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=16,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    assert by_ids.choices[0].model_extra["token_ids"] == r.choices[0].model_extra["token_ids"]
    echoed = client.completions.create(model=server.model, prompt=[prompt], temperature=0, max_tokens=16, echo=True,
                                       extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == prompt + r.choices[0].text


def test_n_choices(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, n=3, max_tokens=8, seed=11,
                                       temperature=1.0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    again = client.chat.completions.create(model=server.model, messages=MESSAGES, n=3, max_tokens=8, seed=11,
                                           temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    stream = client.chat.completions.create(model=server.model, messages=MESSAGES, n=2, max_tokens=6, stream=True,
                                            temperature=0, extra_body={"ignore_eos": True})
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1]  # greedy: both choices are the same


def test_stop_string_from_the_greedy_output(client, server):
    full = client.completions.create(model=server.model, prompt="The city of", temperature=0, max_tokens=40,
                                     extra_body={"ignore_eos": True})
    text = full.choices[0].text
    cut = next((i for i in range(len(text) // 3, len(text) - 3) if text[i:i + 3].strip() == text[i:i + 3]
                and text.find(text[i:i + 3]) == i), None)
    assert cut is not None, text
    stop = text[cut:cut + 3]
    for stream in (False, True):
        r = client.completions.create(model=server.model, prompt="The city of", temperature=0, max_tokens=40,
                                      stop=[stop, "\x00never"], stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(r)
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
            reason, named = [c.finish_reason for c in last], [c.model_extra["stop_reason"] for c in last]
            assert reason == ["stop"] and named == [stop]  # vLLM's stop_reason names the stop string
        else:
            got, reason = r.choices[0].text, r.choices[0].finish_reason
            assert reason == "stop" and r.usage.completion_tokens < 40
            assert r.choices[0].model_extra["stop_reason"] == stop
            # the done line counts the tokens the answer kept, not those sampled before the engine heard
            done = _done_line(server, r.id)
            assert (done["completion_tokens"], done["finish_reason"]) == (r.usage.completion_tokens, "stop")
        assert got == text[:cut]


def _done_line(server, request_id: str) -> dict:
    """The engine's done line of ``request_id``'s first choice (it is written as the answer is sent)."""
    deadline = time.monotonic() + 10
    while True:
        for line in server.err.read_text().splitlines():
            if '"event":"done"' in line and f'"id":"{request_id}-0"' in line:
                return json.loads(line[line.index("{"):])
        assert time.monotonic() < deadline, f"no done line for {request_id}"
        time.sleep(0.05)
    # a stop token of the request's own: its id; a length: null
    ids = client.completions.create(model=server.model, prompt="The city of", temperature=0, max_tokens=40,
                                    extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]
    assert ids.finish_reason == "length" and ids.model_extra["stop_reason"] is None
    token = ids.model_extra["token_ids"][5]
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, extra_body={"ignore_eos": True})
    assert r.choices[0].model_extra["stop_reason"] is None
    r = client.completions.create(model=server.model, prompt="The city of", temperature=0, max_tokens=40,
                                  extra_body={"ignore_eos": True, "stop_token_ids": [token]})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == token


def test_logprobs_format(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert isinstance(entry.token, str) and entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
    c = client.completions.create(model=server.model, prompt="Hello", max_tokens=3, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3 and all(len(t) <= 3 for t in lp.top_logprobs)
    # the legacy format names the chosen token in its top_logprobs too (logprobs + 1 entries at most)
    assert all(top[tok] == v for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))


def test_tool_call_round_trip(client, server, demo_dir):
    transformers = pytest.importorskip("transformers")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 21}'},
    ]
    r = client.chat.completions.create(model=server.model, messages=messages, tools=tools, tool_choice="auto",
                                       max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    hf = transformers.AutoTokenizer.from_pretrained(str(demo_dir))
    expected_messages = [dict(m) for m in messages]
    expected_messages[2] = dict(messages[2], tool_calls=[{"id": "call_abc", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}])
    expected = hf.apply_chat_template(expected_messages, tools=tools, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert r.model_extra["prompt_token_ids"] == list(expected)
    prompts = {choice: client.chat.completions.create(
        model=server.model, messages=messages[:2], tools=tools, tool_choice=choice, max_tokens=2,
        extra_body={"return_token_ids": True}).model_extra["prompt_token_ids"]
        for choice in ("none", "auto")}
    named = client.chat.completions.create(
        model=server.model, messages=messages[:2], tools=tools, max_tokens=2, extra_body={"return_token_ids": True},
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    # tools render whatever the choice (vLLM's default): turning them off for a turn keeps the prompt's prefix
    assert prompts["none"] == prompts["auto"]
    assert named.model_extra["prompt_token_ids"][:len(prompts["auto"])] == prompts["auto"]


def test_reasoning_history_and_request_class(client, server):
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "add"},
                {"role": "user", "content": "3+3?"}]
    r = client.chat.completions.create(model=server.model, messages=messages, max_tokens=4,
                                       extra_body={"request_class": "agent", "chat_template_kwargs":
                                                   {"enable_thinking": False}},
                                       extra_headers={"X-Ignis-Request-Class": "interactive"})
    assert r.choices[0].message.content is not None


def test_metrics_are_open_and_counted(server):
    text = http("GET", server.url + "/metrics").body.decode()
    assert 'ignis:gateway_requests_total{endpoint="chat",model_name="ignis-demo",status="200"}' in text
    assert "ignis:gateway_time_to_first_token_seconds_bucket" in text
    assert "ignis:gateway_streamed_tokens_total" in text and "ignis:gateway_active_streams" in text


def test_continuous_usage_stats_put_each_choices_usage_so_far_in_every_chunk(server):
    body = {"model": server.model, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "n": 2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    r = http("POST", server.url + "/v1/chat/completions", json.dumps(body).encode(),
             {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
    assert r.status == 200
    events = [json.loads(line[6:]) for line in r.body.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert all(e["usage"] is not None for e in events)
    prompt = events[-1]["usage"]["prompt_tokens"]  # the prompt counts once, whatever n
    assert events[0]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}
    seen = {0: 0, 1: 0}
    for e in events[1:-1]:
        (choice,) = e["choices"]
        u = e["usage"]
        assert u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"]
        assert u["completion_tokens"] >= seen[choice["index"]]
        seen[choice["index"]] = u["completion_tokens"]
    assert seen == {0: 8, 1: 8}
    assert events[-1]["usage"]["completion_tokens"] == 16
