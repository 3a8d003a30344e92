"""Tool calls, tool_choice (allowed_tools, strict tools) and reasoning through HTTP under the official Qwen3.5
template (XML calls).

The engine is scripted (``fake_engine``): each request's seed picks the text
it answers with, so what is tested is the gateway: the prompt it sends and
how it parses the answer, streamed and not.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.conftest import http
from tests.gateway.tools_http_support import assemble, create, holds, streamed, tools_gateway, vocab  # noqa: F401 (vocab: a fixture)

llguidance = pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "metric": {"type": "boolean"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time",
                                          "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "Weather in Paris and the time?"}]


def xml_call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


TWO_CALLS = "Checking.\n" + xml_call("get_weather", city="Paris", days="2", metric="true") + "\n" + xml_call("get_time")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5", messages=ASK, tools=TOOLS)


@pytest.fixture(scope="module")
def client(gw):
    with gw.client() as c:
        yield c


def test_two_typed_calls_with_reasoning_not_streamed(gw, client):
    r = create(gw, client, "Two lookups.\n</think>\n\n" + TWO_CALLS,
               extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n")
    msg, choice = r.choices[0].message, r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert msg.reasoning_content == "Two lookups.\n" and msg.content == "Checking.\n"
    assert [c.function.name for c in msg.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Paris", "days": 2, "metric": True}
    assert json.loads(msg.tool_calls[1].function.arguments) == {}
    assert msg.tool_calls[0].id != msg.tool_calls[1].id and msg.tool_calls[0].id.startswith("call_")


def test_two_typed_calls_with_reasoning_streamed(gw, client):
    deltas, reasons = streamed(gw, client, "Two lookups.\n</think>\n\n" + TWO_CALLS,
                               extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert reasons == ["tool_calls"]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Two lookups.\n"
    assert "".join(d.content or "" for d in deltas) == "Checking.\n"
    calls, fragments = assemble(deltas)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2, "metric": True}
    assert calls[1]["arguments"] == "{}"
    # at most one per parameter and one for the closing brace: tokens that reach the gateway together
    # leave it as one delta (parameter-by-parameter fragments are tested on the parser)
    assert fragments[0] <= 4


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_goes_under_both_names_and_include_reasoning_false_leaves_it_out(gw, client, stream):
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    for include in (True, False):
        body = dict(thinking, include_reasoning=include)
        if stream:
            deltas, _ = streamed(gw, client, "Hm.\n</think>\n\nHi.", extra_body=body)
            content = "".join(d.content or "" for d in deltas)
            names = [(getattr(d, "reasoning_content", None), getattr(d, "reasoning", None)) for d in deltas]
            names = [n for n in names if n != (None, None)]
            both = ("".join(a for a, _ in names), "".join(b for _, b in names)) if names else (None, None)
        else:
            msg = create(gw, client, "Hm.\n</think>\n\nHi.", extra_body=body).choices[0].message
            content, both = msg.content, (getattr(msg, "reasoning_content", None), getattr(msg, "reasoning", None))
        assert content == "Hi."
        assert both == (("Hm.\n", "Hm.\n") if include else (None, None))


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_answers_the_first_call_and_ends_there(gw, client, stream):
    text = TWO_CALLS + "\nTrailing words the client never sees."
    kw = dict(parallel_tool_calls=False, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    if stream:
        deltas, reasons = streamed(gw, client, text, **kw)
        calls, _ = assemble(deltas)
        content = "".join(d.content or "" for d in deltas)
    else:
        r = create(gw, client, text, **kw)
        reasons = [r.choices[0].finish_reason]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in r.choices[0].message.tool_calls]
        content = r.choices[0].message.content
        # usage counts what was generated up to the second call's opening, not the whole scripted answer
        assert r.usage.completion_tokens < len(gw.tokenizer.encode(text))
    assert reasons == ["tool_calls"]
    assert content == "Checking.\n"
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2, "metric": True}
    both = create(gw, client, text, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [c.function.name for c in both.choices[0].message.tool_calls] == ["get_weather", "get_time"]


def test_thinking_off_renders_a_closed_block_and_content_stays_clean(gw, client):
    r = create(gw, client, "Sunny.", tools=None, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    msg = r.choices[0].message
    assert msg.content == "Sunny." and getattr(msg, "reasoning_content", None) is None
    assert r.choices[0].finish_reason == "stop" and msg.tool_calls is None


def test_malformed_call_is_content(gw, client):
    text = "<tool_call>\nI am not a function\n</tool_call>"
    r = create(gw, client, text)
    assert r.choices[0].message.content == text and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    deltas, reasons = streamed(gw, client, text)
    assert "".join(d.content or "" for d in deltas) == text and reasons == ["stop"]


def test_named_tool_choice_forces_the_call_opener(gw, client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = create(gw, client, "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>", tool_choice=named)
    opener = gw.tokenizer.encode("<tool_call>\n<function=get_weather>\n")
    ids = gw.last_prompt_ids()
    assert ids[-len(opener):] == opener
    assert gw.last_prompt().endswith("<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n")
    assert r.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]
    deltas, reasons = streamed(gw, client, "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
                               tool_choice=named)
    calls, _ = assemble(deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert reasons == ["tool_calls"]


def test_named_call_with_a_garbage_body_is_still_a_well_formed_answer(gw, client):
    r = create(gw, client, "zq <<< >>> 17 ¿", tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == [("get_time", "{}")]


def test_named_call_with_thinking_on_closes_the_think_block_first(gw, client):
    create(gw, client, "</function>\n</tool_call>", tool_choice={"type": "function", "function": {"name": "get_time"}},
           extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_time>\n")
    # Tokenized as one text: "\n\n" inside the closed block is the one token a whole prompt has.
    assert gw.last_prompt_ids() == gw.tokenizer.encode(gw.last_prompt())


def test_required_tool_choice_opens_a_call(gw, client):
    r = create(gw, client, "<function=get_time>\n</function>\n</tool_call>", tool_choice="required")
    assert gw.last_prompt().endswith("</think>\n\n<tool_call>\n")
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]
    refused = create(gw, client, "No call, sorry.", tool_choice="required")
    assert refused.choices[0].message.content == "No call, sorry." and refused.choices[0].finish_reason == "stop"


def test_tool_choice_none_renders_the_tools_and_parses_no_calls(gw, client):
    text = xml_call("get_time")
    r = create(gw, client, text, tool_choice="none")
    none_prompt = gw.last_prompt()
    assert r.choices[0].message.content == text and r.choices[0].message.tool_calls is None
    create(gw, client, "ok", tool_choice="auto")
    assert "# Tools" in none_prompt and none_prompt == gw.last_prompt()  # the prompt (and its reuse) unchanged


@pytest.fixture(scope="module")
def excluding(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5", "--exclude-tools-when-tool-choice-none", messages=ASK,
                             tools=TOOLS)


def test_exclude_tools_when_tool_choice_none_leaves_them_out(excluding):
    text = xml_call("get_time")
    with excluding.client() as client:
        r = create(excluding, client, text, tool_choice="none")
        assert "# Tools" not in excluding.last_prompt() and "get_weather" not in excluding.last_prompt()
        assert r.choices[0].message.content == text and r.choices[0].message.tool_calls is None
        body = {"model": excluding.model, "messages": ASK, "tools": TOOLS, "tool_choice": "none"}
        counted = http("POST", excluding.url + "/tokenize", json.dumps(body).encode(),
                       {"Content-Type": "application/json"}).json()
        assert counted["count"] == r.usage.prompt_tokens
        create(excluding, client, "ok", tool_choice="auto")
        assert "# Tools" in excluding.last_prompt()


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_written_inside_unclosed_reasoning_is_a_call(gw, client, stream):
    # Qwen3.5 may open a call while thinking without writing </think> first
    text = "I need the time.\n\n" + xml_call("get_time")
    kwargs = {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}
    if stream:
        deltas, reasons = streamed(gw, client, text, **kwargs)
        calls, _ = assemble(deltas)
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
    else:
        r = create(gw, client, text, **kwargs)
        msg, reasons = r.choices[0].message, [r.choices[0].finish_reason]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or ()]
        reasoning, content = msg.reasoning_content, msg.content or ""
    assert reasons == ["tool_calls"] and [c["name"] for c in calls] == ["get_time"]
    assert reasoning == "I need the time.\n\n" and content == ""


def test_history_with_calls_results_and_reasoning_renders_as_the_template_expects(gw, client):
    messages = ASK + [
        {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temp": 21}'}]
    r = create(gw, client, "It is 21 degrees.", messages=messages)
    prompt = gw.last_prompt()
    assert ("<|im_start|>assistant\n<think>\nAsk the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n") in prompt
    assert r.choices[0].message.content == "It is 21 degrees."


def test_earlier_turns_reasoning_is_dropped_before_the_last_user_query(gw, client):
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "add"},
                {"role": "user", "content": "3+3?"}]
    create(gw, client, "6", messages=messages, tools=None)
    assert "<|im_start|>assistant\n4<|im_end|>" in gw.last_prompt() and "add" not in gw.last_prompt()


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice.function.name", "launch"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages[1]",
     "no earlier assistant message"),
    ({"messages": ASK + [
        {"role": "assistant", "tool_calls": [{"id": "call_a", "type": "function",
                                              "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_b", "content": "1"}]}, "messages[2].tool_call_id", "call_b"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": 7}}]}]},
     "messages[1].tool_calls[0].function.arguments", "must be a string"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{nope"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [  # a lone surrogate: no text to render
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"s": "x\\ud800"}'}}]}]},
     "messages[1].tool_calls[0].function.arguments", "lone UTF-16 surrogate"),
]


@pytest.mark.parametrize("fields,param,words", BAD)
def test_bad_tool_inputs_are_400_and_the_next_request_is_served(gw, client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3_5", tools=TOOLS, max_tokens=4,
                                       **{"messages": ASK, **fields})
    err = e.value.body
    assert err["param"] == param and words in err["message"], err
    assert create(gw, client, "fine").choices[0].message.content == "fine"


# ----- allowed_tools and strict tools in auto mode: what the engine is sent ---------------------------
# The grammar is fed, token by token on Qwen3.5's real vocabulary, answers a model could write: free text
# and allowed calls go through to the end; a call of a tool left out, or a strict tool's bad arguments, stop.

THOUGHT = "The user wants the weather.</think>\n\n"  # the template opens the thinking block
WEATHER_CALL = "Let me check.\n" + xml_call("get_weather", city="Paris", days="2")
CLOCK_CALL = xml_call("get_time")
ONLY_CLOCK = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
    {"type": "function", "function": {"name": "get_time"}}]}}


def test_allowed_tools_auto_keeps_every_tool_in_the_prompt_and_holds_calls_to_the_allowed(gw, client, vocab):
    r = create(gw, client, CLOCK_CALL, tool_choice=ONLY_CLOCK)
    assert r.choices[0].message.tool_calls[0].function.name == "get_time"
    prompt, grammar = gw.last_prompt(), gw.engine.generates[-1].grammar
    assert "get_weather" in prompt and "get_time" in prompt  # the prompt is the same whatever is allowed
    create(gw, client, "Hi.")
    assert gw.last_prompt() == prompt and gw.engine.generates[-1].grammar is None  # plain auto: no grammar
    assert grammar is not None
    assert holds(vocab, grammar, THOUGHT + "It is noon, no tool needed.")
    assert holds(vocab, grammar, THOUGHT + "One moment.\n" + CLOCK_CALL)
    assert not holds(vocab, grammar, THOUGHT + WEATHER_CALL)  # get_weather is not allowed


def test_allowed_tools_required_forces_a_call_of_an_allowed_tool(gw, client, vocab):
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}
    r = create(gw, client, "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
               tool_choice=choice)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    assert gw.last_prompt().endswith("<tool_call>\n") and "get_time" in gw.last_prompt()
    grammar = gw.engine.generates[-1].grammar
    assert holds(vocab, grammar, "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
                                 "</tool_call>")
    assert not holds(vocab, grammar, "<function=get_time>\n</function>\n</tool_call>")


def test_a_strict_tool_has_its_arguments_held_in_auto_mode(gw, client, vocab):
    strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
    create(gw, client, WEATHER_CALL, tools=[strict, CLOCK])
    grammar = gw.engine.generates[-1].grammar
    assert grammar is not None
    assert holds(vocab, grammar, THOUGHT + WEATHER_CALL)
    assert not holds(vocab, grammar, THOUGHT + "Let me check.\n" + xml_call("get_weather", city="Paris", days="two"))
    assert holds(vocab, grammar, THOUGHT + xml_call("get_time", zone="UTC"))  # not strict: any arguments
    assert holds(vocab, grammar, THOUGHT + "No call at all.")


def test_bad_allowed_tools_are_400s(gw, client):
    bad = [({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                {"type": "function", "function": {"name": "get_stock"}}]}},
            "tool_choice.allowed_tools.tools[0].function.name"),
           ({"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}},
            "tool_choice.allowed_tools.mode"),
           ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
            "tool_choice.allowed_tools.tools")]
    for choice, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            create(gw, client, "x", tool_choice=choice)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        create(gw, client, "x", tool_choice=ONLY_CLOCK, response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"


def test_the_engine_serves_held_auto_calls_and_free_text_is_unchanged(server):
    """On the demo model (whose random weights write no call), the grammar of an allowed subset compiles in
    the engine and leaves the answer as the plain request's (same prompt); a strict tool's is served too
    (its prompt differs: the template renders the tool's ``strict``)."""
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key=server.api_key, max_retries=0, timeout=120) as c:
        def answer(tools, **kw):
            r = c.chat.completions.create(model=server.model, messages=ASK, tools=tools, max_tokens=12,
                                          temperature=0, **kw)
            return r.choices[0].message.content, r.choices[0].finish_reason

        plain = answer(TOOLS)
        assert answer(TOOLS, tool_choice=ONLY_CLOCK) == plain
        strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
        content, finish = answer([strict, CLOCK])
        assert content and finish == "length"
