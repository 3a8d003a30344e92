"""Rendered prompts equal transformers' ``apply_chat_template`` for the same messages and tools.

The gateway renders with its own jinja environment (no transformers at run
time); these tests hold it to transformers' output, text and token ids, on
the demo template and on a small template using the environment's extras.
"""

from __future__ import annotations

import copy
import json

import pytest

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import apply_developer_policy, parse_messages
from ignis.gateway.prompt import build_chat_prompt
from tests.support.real_tokenizer import TemplateMissing, chat_template

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city — ünïcode ok",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time",
                                          "parameters": {"type": "object", "properties": {}}}}

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

CONVERSATIONS = {
    "single_user": ([{"role": "user", "content": "Hello!"}], None),
    "system_user": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], None),
    "multi_turn": ([
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "one"},
        {"role": "assistant", "content": "uno"}, {"role": "user", "content": "two"}], None),
    "tools_no_system": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER, CLOCK]),
    "tools_system": ([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather?"}], [WEATHER]),
    "tool_round_trip": ([
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "second result"}], [WEATHER]),
    "reasoning_history": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\nsum\n</think>\n\n6"}], None),
    "content_parts": ([{"role": "user", "content": [{"type": "text", "text": "part one "},
                                                    {"type": "text", "text": "part two"}]}], None),
    "developer": ([
        {"role": "system", "content": "Base rules."}, {"role": "user", "content": "q1"},
        {"role": "developer", "content": "Extra rule."}, {"role": "user", "content": "q2"}], [CLOCK]),
    "developer_first": ([{"role": "developer", "content": "Dev only."}, {"role": "user", "content": "hi"}], None),
}


@pytest.fixture(scope="module")
def hf_tokenizer(demo_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(demo_dir))


@pytest.fixture(scope="module")
def template(demo_files):
    return ChatTemplate(demo_files.chat_template, demo_files.tokenizer.special_tokens_map())


def ours(template, tok, raw_messages, tools, policy="in-place", **kwargs):
    """What the gateway renders for these request messages (validated, policy applied)."""
    messages = apply_developer_policy(parse_messages(Fields({"messages": raw_messages})), policy)
    return messages, build_chat_prompt(template, tok, messages, tools, kwargs or None)


def hf_messages(messages):
    """The messages as handed to transformers: the same dicts the template sees."""
    return copy.deepcopy(messages)


CASES = [(name, "in-place") for name in sorted(CONVERSATIONS)] + [
    (name, policy) for name in ("developer", "developer_first") for policy in ("into-system", "after-system")]


@pytest.mark.parametrize("name,policy", CASES)
def test_render_matches_transformers(hf_tokenizer, template, demo_tokenizer, name, policy):
    raw, tools = CONVERSATIONS[name]
    messages, prompt = ours(template, demo_tokenizer, raw, tools, policy)
    for add_gen in (True, False):
        expected = hf_tokenizer.apply_chat_template(hf_messages(messages), tools=tools, tokenize=False,
                                                    add_generation_prompt=add_gen)
        got = template.render(messages, tools, add_generation_prompt=add_gen)
        assert got == expected
    ids = hf_tokenizer.apply_chat_template(hf_messages(messages), tools=tools, tokenize=True,
                                           add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert prompt.ids == list(ids)


def test_in_place_developer_is_a_system_turn_where_it_arrives(template, demo_tokenizer):
    messages, prompt = ours(template, demo_tokenizer, CONVERSATIONS["developer"][0], None)
    assert [m["role"] for m in messages] == ["system", "user", "system", "user"]
    assert prompt.text.index("Extra rule.") > prompt.text.index("q1")


def test_into_system_merges_and_after_system_moves(template, demo_tokenizer):
    raw = CONVERSATIONS["developer"][0]
    merged, p1 = ours(template, demo_tokenizer, raw, None, "into-system")
    assert merged[0] == {"role": "system", "content": "Base rules.\n\nExtra rule."} and len(merged) == 3
    moved, p2 = ours(template, demo_tokenizer, raw, None, "after-system")
    assert [m["content"] for m in moved] == ["Base rules.", "Extra rule.", "q1", "q2"]
    created, _ = ours(template, demo_tokenizer, CONVERSATIONS["developer_first"][0], None, "into-system")
    assert created[0] == {"role": "system", "content": "Dev only."}


def test_tool_call_arguments_reach_the_template_as_objects(template, demo_tokenizer):
    messages, prompt = ours(template, demo_tokenizer, *CONVERSATIONS["tool_round_trip"])
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt.text
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in prompt.text


def test_capture_marks(template, demo_tokenizer):
    raw, tools = CONVERSATIONS["tools_system"]
    messages, prompt = ours(template, demo_tokenizer, raw, tools)
    system_text = template.render(messages[:1], tools, add_generation_prompt=False)
    assert prompt.system_end == len(demo_tokenizer.encode(system_text))
    assert prompt.ids[:prompt.system_end] == demo_tokenizer.encode(system_text)
    opener = demo_tokenizer.encode("<|im_start|>assistant\n")
    assert prompt.ids[prompt.opener_start:] == opener
    assert prompt.last_is_user and not prompt.starts_in_reasoning


def test_marks_without_system_and_after_tool_results(template, demo_tokenizer):
    _, plain = ours(template, demo_tokenizer, *CONVERSATIONS["single_user"])
    assert plain.system_end is None and plain.opener_start is not None
    _, tooled = ours(template, demo_tokenizer, *CONVERSATIONS["tool_round_trip"])
    assert not tooled.last_is_user and tooled.system_end < tooled.opener_start


def test_think_opened_by_the_generation_prompt(demo_files, demo_tokenizer):
    opener = "{{- '<|im_start|>assistant\\n' -}}\n    {%- if enable_thinking"
    source = demo_files.chat_template.replace(opener, opener.replace("\\n' -}}", "\\n<think>\\n' -}}", 1))
    assert source != demo_files.chat_template
    t = ChatTemplate(source, demo_tokenizer.special_tokens_map())
    _, prompt = ours(t, demo_tokenizer, [{"role": "user", "content": "hi"}], None)
    assert prompt.starts_in_reasoning
    _, closed = ours(template_of(demo_files), demo_tokenizer, [{"role": "user", "content": "hi"}], None,
                     enable_thinking=False)
    assert closed.text.endswith("<think>\n\n</think>\n\n") and not closed.starts_in_reasoning


def template_of(demo_files):
    return ChatTemplate(demo_files.chat_template, demo_files.tokenizer.special_tokens_map())


EXTRAS_TEMPLATE = """{%- set ns = namespace(count=0) -%}
{%- for m in messages -%}
{%- if m.role not in ['user', 'assistant', 'system'] -%}{{ raise_exception('bad role ' + m.role) }}{%- endif -%}
{%- set ns.count = ns.count + 1 -%}
{%- if loop.index > 3 -%}{%- break -%}{%- endif -%}
[{{ m.role }}|{{ eos_token }}] {{ m.content }}
{% endfor -%}
{%- if tools -%}{{ tools | tojson(indent=2) }}{{ {'ü': 1} | tojson }}{%- endif -%}
{{ ns.count }} {{ strftime_now('%Y') }} {{ dict(a=1) | tojson }}
"""


def test_environment_extras_match_transformers(hf_tokenizer, demo_tokenizer):
    t = ChatTemplate(EXTRAS_TEMPLATE, demo_tokenizer.special_tokens_map())
    msgs = [{"role": "user", "content": f"m{i} <b>&amp;</b>"} for i in range(5)]
    got = t.render(msgs, [WEATHER], add_generation_prompt=True)
    expected = hf_tokenizer.apply_chat_template(msgs, tools=[WEATHER], tokenize=False, add_generation_prompt=True,
                                                chat_template=EXTRAS_TEMPLATE)
    assert got == expected and "ü" in got and "&amp;" in got


def test_template_errors_are_render_errors(demo_tokenizer):
    t = ChatTemplate(EXTRAS_TEMPLATE, {})
    with pytest.raises(TemplateRenderError, match="bad role tool"):
        t.render([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError):
        ChatTemplate("{% if %}", {})


def test_namespace_refuses_underscore_names():
    t = ChatTemplate("{% set ns = namespace(_x=1) %}{{ ns._x }}", {})
    with pytest.raises(TemplateRenderError):
        t.render([])
    assert json.loads(ChatTemplate("{{ messages | tojson }}", {}).render([{"role": "user", "content": "é"}])) \
        == [{"role": "user", "content": "é"}]


def test_a_tool_results_text_parts_are_joined_by_newlines_whatever_the_content_format():
    """vLLM and SGLang hand a tool result's text parts to the template as one text, joined by newlines: Qwen3.5's
    template, which reads a content's parts, glued them ("line oneline two"). A user's parts stay parts."""
    try:
        t = ChatTemplate(chat_template("qwen3_5"))
    except TemplateMissing as e:
        pytest.skip(str(e))
    assert t.content_format == "openai"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = t.render([{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": "", "tool_calls": [call, call]},
                     {"role": "tool", "content": [{"type": "text", "text": "line one"},
                                                  {"type": "text", "text": "line two"}]},
                     {"role": "tool", "content": [{"type": "text", "text": "see"}, image]}])
    assert "<|im_start|>user\na b<|im_end|>" in text
    assert "<tool_response>\nline one\nline two\n</tool_response>" in text
    assert "<tool_response>\nsee<|vision_start|><|image_pad|><|vision_end|>\n</tool_response>" in text


def test_a_template_that_never_reads_tools_is_told_apart(template):
    assert template.reads_tools
    assert not ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").reads_tools
