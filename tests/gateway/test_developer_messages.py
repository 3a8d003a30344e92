"""Developer messages under ``in-place`` on templates that take a system turn only first, and on those that don't."""

from __future__ import annotations

import pytest

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import DEVELOPER_TURN_PREFIX, apply_developer_policy, parse_messages
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.tokenizer import load_model_files
from tests.support.real_tokenizer import TemplateMissing, chat_template

HISTORY = [{"role": "system", "content": "Base rules."}, {"role": "user", "content": "q1"},
           {"role": "assistant", "content": "a1"}]
LATE_DEVELOPER = HISTORY + [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "q2"}]

DROPS_LATE_SYSTEM = """{%- for m in messages -%}
{%- if m.role != 'system' or loop.first -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}
{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"""
"""Renders a system turn only first and silently leaves later ones out."""


@pytest.fixture(scope="module")
def official(real_tokenizer_dir):
    try:
        source = chat_template("qwen3_5")
    except TemplateMissing as e:
        pytest.skip(str(e))
    tok = load_model_files(real_tokenizer_dir("qwen3_5")).tokenizer
    return ChatTemplate(source, tok.special_tokens_map()), tok


def placed(raw: list[dict], policy: str, template: ChatTemplate) -> list[dict]:
    return apply_developer_policy(parse_messages(Fields({"messages": raw})), policy, template.takes_late_system)


def test_which_templates_take_a_late_system_turn(official, demo_files):
    assert not official[0].takes_late_system
    assert ChatTemplate(chat_template("qwen3_next")).takes_late_system
    assert ChatTemplate(demo_files.chat_template).takes_late_system
    assert not ChatTemplate(DROPS_LATE_SYSTEM).takes_late_system


def test_in_place_developer_becomes_a_prefixed_user_turn_where_it_stands(official):
    template, tok = official
    messages = placed(LATE_DEVELOPER, "in-place", template)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user"]
    assert messages[3]["content"] == DEVELOPER_TURN_PREFIX + "Answer in French."
    prompt = build_chat_prompt(template, tok, messages, None)
    assert "<|im_start|>user\nDeveloper instructions:\nAnswer in French.<|im_end|>\n<|im_start|>user\nq2" in prompt.text
    # the earlier history renders byte for byte as it did on the turn before
    before = build_chat_prompt(template, tok, placed(HISTORY[:2], "in-place", template), None)
    assert prompt.text.startswith(before.text[:before.text.rindex("<|im_start|>assistant\n")])
    assert prompt.marks.missing == ()


def test_a_first_developer_message_stays_a_system_turn(official):
    template, tok = official
    messages = placed([{"role": "developer", "content": "Dev rules."}, {"role": "user", "content": "hi"}],
                      "in-place", template)
    assert messages[0] == {"role": "system", "content": "Dev rules."}
    assert build_chat_prompt(template, tok, messages, None).text.startswith("<|im_start|>system\nDev rules.<|im_end|>")


def test_late_developer_stays_a_system_turn_where_the_template_takes_one(demo_files):
    template = ChatTemplate(demo_files.chat_template)
    messages = placed(LATE_DEVELOPER, "in-place", template)
    assert messages[3] == {"role": "system", "content": "Answer in French."}


def test_other_policies_keep_their_meaning_on_the_official_template(official):
    template, tok = official
    merged = build_chat_prompt(template, tok, placed(LATE_DEVELOPER, "into-system", template), None)
    assert merged.text.startswith("<|im_start|>system\nBase rules.\n\nAnswer in French.<|im_end|>\n<|im_start|>user\nq1")
    moved = placed(LATE_DEVELOPER, "after-system", template)
    assert [m["role"] for m in moved] == ["system", "user", "user", "assistant", "user"]
    after = build_chat_prompt(template, tok, moved, None)
    assert after.text.startswith("<|im_start|>system\nBase rules.<|im_end|>\n<|im_start|>user\n"
                                 "Developer instructions:\nAnswer in French.<|im_end|>\n<|im_start|>user\nq1")


def test_a_late_system_message_is_still_the_templates_refusal(official):
    template, tok = official
    messages = placed(HISTORY + [{"role": "system", "content": "late"}, {"role": "user", "content": "q2"}],
                      "in-place", template)
    with pytest.raises(TemplateRenderError, match="System message must be at the beginning"):
        build_chat_prompt(template, tok, messages, None)


def test_string_content_format_joins_text_only_lists():
    from ignis.gateway.chat_template import ChatTemplate

    source = ("{%- for m in messages %}[{{ m.role }}:{% if m.content is string %}{{ m.content }}"
              "{% else %}{% for p in m.content %}<{{ p.type }}>{% endfor %}{% endif %}]{%- endfor %}")
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": [{"type": "text", "text": "c"}, image]},
                {"role": "assistant", "content": "d"}]
    joined = ChatTemplate(source, content_format="string").render(messages, add_generation_prompt=False)
    assert joined == "[user:a\nb][user:<text><image_url>][assistant:d]"  # a list with an image stays a list
    assert ChatTemplate(source, content_format="openai").render(messages).startswith("[user:<text><text>]")
    assert isinstance(messages[0]["content"], list)  # the caller's messages are left as they were


@pytest.mark.parametrize("source, detected", [
    ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{{ '' }}{% endif %}{% endfor %}",
     "string"),  # Qwen3-Next's: a content that is not a string renders as nothing
    ("{% for m in messages %}{% for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}", "openai"),
    ("{% macro r(content) %}{% for item in content %}{{ item.text }}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{{ r(m.content) }}{% endfor %}", "openai"),  # Qwen3.5's render_content
    ("{% for m in messages %}{% set c = m.content %}{% for part in c %}{{ part.text }}{% endfor %}{% endfor %}",
     "openai"),  # a content by another name
    ("{% macro show(x, sep) %}{% for item in x %}{{ item.text }}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{% set body = m['content'] | default('') %}{{ show(sep=',', x=body) }}{% endfor %}",
     "openai"),  # through a set, then a macro's keyword parameter
    ("{% for m in messages %}{% set c = m.role %}{% for ch in c %}{{ ch }}{% endfor %}"
     "{{ m.content if m.content is string else '' }}{% endfor %}", "string"),  # a loop over something else
])
def test_auto_detects_how_a_template_reads_content_as_vllm_does(source, detected):
    from ignis.gateway.chat_template import ChatTemplate

    template = ChatTemplate(source)
    assert template.content_format == detected and template.joins_parts == (detected == "string")
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}]
    assert "hello" in template.render(parts, add_generation_prompt=False)  # never rendered as nothing
