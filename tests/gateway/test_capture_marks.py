"""Capture marks found by probe renders on the official Qwen3.5, the Qwen3-Next-style and the demo templates.

Expected marks are read off the rendered text (ChatML): the system block ends
where the second ``<|im_start|>`` begins, the opener starts at the last
``<|im_start|>assistant``; their token counts are what the finder must give.
"""

from __future__ import annotations

import pytest

from ignis.gateway.capture_marks import MarkFinder
from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.tokenizer import load_model_files
from tests.support.real_tokenizer import TemplateMissing, chat_template

TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Tool number {i} reads files for the user.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    for i in range(3)]
SYSTEM = {"role": "system", "content": "You are a careful coding agent. Answer the user briefly."}
CALL = {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": {"path": "a.py"}}}

CONVERSATIONS = {
    "subagent": ([SYSTEM, {"role": "user", "content": "Task 3: read a.py"}], TOOLS),
    "agent_loop": ([SYSTEM, {"role": "user", "content": "Fix the test."},
                    {"role": "assistant", "content": "", "reasoning_content": "Look first.", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": "def f(): pass"},
                    {"role": "assistant", "content": "Patching.", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}], TOOLS),
    "system_only": ([SYSTEM, {"role": "user", "content": "hi"}], None),
    "tools_only": ([{"role": "user", "content": "hi"}], TOOLS),
}


class CountingTemplate(ChatTemplate):
    """A template that counts its renders."""

    renders = 0

    def render(self, *args, **kwargs):
        self.renders += 1
        return super().render(*args, **kwargs)


@pytest.fixture(scope="module")
def families(real_tokenizer_dir, demo_files):
    """(template source, tokenizer) of each template under test."""
    out = {"demo": (demo_files.chat_template, demo_files.tokenizer)}
    for family in ("qwen3_5", "qwen3_next"):
        try:
            out[family] = (chat_template(family), load_model_files(real_tokenizer_dir(family)).tokenizer)
        except TemplateMissing as e:
            pytest.skip(str(e))
    return out


def expected_marks(tok, text: str) -> tuple[int | None, int]:
    system_end = None
    if text.startswith("<|im_start|>system"):
        system_end = len(tok.encode(text[:text.index("<|im_start|>", 1)]))
    return system_end, len(tok.encode(text[:text.rindex("<|im_start|>assistant")]))


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "demo"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_marks_match_the_rendered_turns(families, family, name):
    source, tok = families[family]
    template = ChatTemplate(source, tok.special_tokens_map())
    messages, tools = CONVERSATIONS[name]
    prompt = build_chat_prompt(template, tok, messages, tools)
    assert (prompt.system_end, prompt.opener_start) == expected_marks(tok, prompt.text)
    assert prompt.marks.missing == ()
    assert prompt.ids[:prompt.opener_start] == tok.encode(prompt.text[:prompt.text.rindex("<|im_start|>assistant")])


def test_official_template_raises_on_the_system_block_alone_and_still_gets_its_marks(families):
    source, tok = families["qwen3_5"]
    template = ChatTemplate(source, tok.special_tokens_map())
    with pytest.raises(TemplateRenderError, match="No user query found"):
        template.render([SYSTEM], TOOLS, add_generation_prompt=False)
    prompt = build_chat_prompt(template, tok, *CONVERSATIONS["subagent"])
    assert prompt.system_end is not None and prompt.system_end > 200
    assert prompt.text[:prompt.text.index("<|im_start|>user")].endswith(SYSTEM["content"] + "<|im_end|>\n")


def test_official_template_thinking_opener(families):
    source, tok = families["qwen3_5"]
    template = ChatTemplate(source, tok.special_tokens_map())
    on = build_chat_prompt(template, tok, *CONVERSATIONS["subagent"], {"enable_thinking": True})
    off = build_chat_prompt(template, tok, *CONVERSATIONS["subagent"])
    assert on.marks.opener_text == "<|im_start|>assistant\n<think>\n" and on.starts_in_reasoning
    assert off.marks.opener_text == "<|im_start|>assistant\n<think>\n\n</think>\n\n" and not off.starts_in_reasoning
    assert on.system_end == off.system_end


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "demo"])
def test_cached_block_renders_no_probe(families, family):
    source, tok = families[family]
    template = CountingTemplate(source, tok.special_tokens_map())
    first = build_chat_prompt(template, tok, *CONVERSATIONS["subagent"])
    cold = template.renders
    assert cold == 5  # the prompt, two system-block probes, the opener with and without the generation prompt
    other = [SYSTEM, {"role": "user", "content": "Task 7: something else entirely"}]
    second = build_chat_prompt(template, tok, other, TOOLS)
    assert template.renders == cold + 1
    assert second.system_end == first.system_end and second.marks.missing == ()
    changed = [dict(SYSTEM, content="Another system prompt."), other[1]]
    build_chat_prompt(template, tok, changed, TOOLS)
    assert template.renders == cold + 1 + 3  # a new block: its two probes again, the opener stays cached


# ----- templates whose marks cannot be found --------------------------------------------------

COUNTING_SYSTEM = """{%- for m in messages -%}
{%- if m.role == 'system' -%}{{ '<|im_start|>system\\n' + m.content + ' (' ~ (messages|length) ~ ' turns)<|im_end|>\\n' }}
{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"""
"""Names the conversation's length inside the system turn: the block differs from one turn to the next."""

PLAIN_TEXT = """{%- for m in messages -%}{{ m.role | capitalize }}: {{ m.content }}
{% endfor -%}{%- if add_generation_prompt -%}Assistant:{%- endif -%}"""
"""No added tokens at all: no turn boundary a tokenization is known to respect."""

TWO_USER_TURNS = """{%- if (messages | selectattr('role', 'equalto', 'user') | list | length) < 2 -%}
{{- raise_exception('This template needs two user turns.') -}}{%- endif -%}""" + COUNTING_SYSTEM.replace(
    " (' ~ (messages|length) ~ ' turns)", "")
"""Raises on every conversation with fewer than two user turns, the probes included."""


def test_system_block_that_changes_per_turn_is_missing_not_a_prefix(demo_tokenizer):
    template = ChatTemplate(COUNTING_SYSTEM)
    short = build_chat_prompt(template, demo_tokenizer, [SYSTEM, {"role": "user", "content": "q"}], None)
    assert short.system_end == expected_marks(demo_tokenizer, short.text)[0] and short.marks.missing == ()
    long = [SYSTEM, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"}]
    prompt = build_chat_prompt(template, demo_tokenizer, long, None)
    assert prompt.system_end is None and prompt.opener_start == expected_marks(demo_tokenizer, prompt.text)[1]
    assert prompt.marks.missing == (("system_end", "not_a_prefix"),)
    assert prompt.marks.missing_text == "system_end: not_a_prefix"


def test_template_without_added_tokens_reports_both_marks_missing(demo_tokenizer):
    template = ChatTemplate(PLAIN_TEXT)
    prompt = build_chat_prompt(template, demo_tokenizer, [SYSTEM, {"role": "user", "content": "q"}], None)
    assert prompt.text.startswith("System: ") and prompt.text.endswith("Assistant:")
    assert (prompt.system_end, prompt.opener_start) == (None, None)
    assert prompt.marks.missing == (("system_end", "no_turn_boundary"), ("opener_start", "not_a_prefix"))


def test_template_refusing_the_probes_still_serves_and_finds_the_opener_from_history(demo_tokenizer):
    template = ChatTemplate(TWO_USER_TURNS)
    messages = [SYSTEM, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"}]
    prompt = build_chat_prompt(template, demo_tokenizer, messages, None)
    assert prompt.marks.missing == (("system_end", "probe_refused"),)
    assert prompt.opener_start == expected_marks(demo_tokenizer, prompt.text)[1]
    with pytest.raises(TemplateRenderError, match="needs two user turns"):
        build_chat_prompt(template, demo_tokenizer, messages[:2], None)


def test_no_system_and_no_tools_is_no_mark_rather_than_a_missing_one(families):
    for source, tok in families.values():
        prompt = build_chat_prompt(ChatTemplate(source, tok.special_tokens_map()), tok,
                                   [{"role": "user", "content": "hi"}], None)
        assert prompt.system_end is None and prompt.marks.missing == ()


def test_one_finder_per_template_and_tokenizer(demo_files):
    from ignis.gateway.prompt import mark_finder

    template = ChatTemplate(demo_files.chat_template)
    finder = mark_finder(template, demo_files.tokenizer)
    assert isinstance(finder, MarkFinder) and mark_finder(template, demo_files.tokenizer) is finder
    assert mark_finder(ChatTemplate(demo_files.chat_template), demo_files.tokenizer) is not finder


def test_tools_orjson_cannot_encode_still_get_a_cached_block(demo_files):
    tok = demo_files.tokenizer
    huge = [{"type": "function", "function": {"name": "big", "description": "d", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "default": 2**70}}}}}]
    template = CountingTemplate(demo_files.chat_template)
    first = build_chat_prompt(template, tok, [SYSTEM, {"role": "user", "content": "a"}], huge)
    renders = template.renders
    second = build_chat_prompt(template, tok, [SYSTEM, {"role": "user", "content": "b"}], huge)
    assert template.renders == renders + 1
    assert first.system_end == second.system_end == expected_marks(tok, second.text)[0]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "demo"])
def test_the_part_mark_from_the_messages_up_to_it_equals_the_mark_from_them_all(families, family):
    """``part_end`` renders only the messages up to the multi-part one: the mark equals the one a render of
    the whole conversation gives (later turns, reasoning and calls included), under every template (the
    Qwen3-Next-style one reads content as a string: the parts are joined for it, as vLLM's auto format does)."""
    from ignis.gateway.part_marks import part_end
    from ignis.gateway.turn_boundaries import common_prefix_len

    source, tok = families[family]
    template = ChatTemplate(source, tok.special_tokens_map())
    parts = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>skills</system-reminder>"},
                                         {"type": "text", "text": "list the files"}]}
    later = [{"role": "assistant", "content": "", "reasoning_content": "look first",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
             {"role": "assistant", "content": "Two files.", "reasoning_content": "done"},
             {"role": "user", "content": "and now?"}]
    for messages in ([SYSTEM, parts], [SYSTEM, parts, *later], [parts, *later]):
        prompt = build_chat_prompt(template, tok, messages, TOOLS)
        assert "skills</system-reminder>" in prompt.text and "list the files" in prompt.text  # never dropped
        mark = part_end(template, tok, messages, TOOLS, None, prompt.ids, prompt.opener_start)
        whole = list(messages)
        whole[messages.index(parts)] = dict(parts, content=parts["content"][:-1])
        n = common_prefix_len(prompt.ids, tok.encode(template.render(whole, TOOLS, add_generation_prompt=False)))
        assert mark == (n if 0 < n < len(prompt.ids) and n <= prompt.opener_start else None), (family, len(messages))
        assert mark is not None
