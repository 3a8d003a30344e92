"""Random agent conversations become the prompt transformers renders, text and token ids, under the real templates.

Hypothesis draws OpenAI chat requests as agents send them: a system or
developer message first (or none), several user turns (a string or text
parts; unicode, newlines, text that looks like template markup), assistant
turns with any mix of content, reasoning and several tool calls (arguments
as JSON strings of nested objects), one or several tool results after a
call, 0-4 tools with nested parameter schemas, ``enable_thinking`` true,
false or absent, and an ending that asks for a generation prompt, continues
the final assistant message (``continue_final_message``) or adds no prompt
(``add_generation_prompt: false``).

Each request goes the chat path's way from body to prompt (parse, tool
results checked, developer turns placed, tools, template kwargs,
``build_chat_prompt``, the part mark) and /tokenize's (``render_chat_ids``);
both must give transformers' ``apply_chat_template`` text and ids for the
messages as vLLM hands them to it (``as_vllm_hands_them``: string arguments
parsed, text parts joined for a template that reads a content as a string and
in any tool result, developer turns where in-place places them). Where
transformers raises (the template refuses the shape), the gateway answers a
400, never another prompt nor a crash; so too where it refuses to continue a
final message with no text, with calls, or whose text the final turn does not
render as given (``continues_no_text``, ``continued_text_not_rendered``). A
continued prompt may differ from transformers' in whitespace at the cut alone
(``cut_apart_by_whitespace``, a known difference). Ids are transformers' where
its tokenizer reads the text as tokenizer.json does. Qwen3.5's official
template and the Qwen3-Next-style one, each on its family's real tokenizer.

A few dozen examples per template by default; ``IGNIS_LONG_TESTS=1`` also
runs the long mode (marked ``long``): many more and longer conversations.
"""

from __future__ import annotations

import copy
import json
import os
import types

import pytest
import tokenizers
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from ignis.gateway.chat import _continues, rendering_errors, template_kwargs
from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import (
    DEVELOPER_TURN_PREFIX,
    apply_developer_policy,
    check_tool_results,
    parse_messages,
    parse_tool_choice,
    parse_tools,
    prompt_tools,
)
from ignis.gateway.part_marks import part_end
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.tokenize_api import render_chat_ids
from ignis.gateway.tokenizer import load_model_files
from tests.support.real_tokenizer import TemplateMissing, chat_template

transformers = pytest.importorskip("transformers")

LONG = os.environ.get("IGNIS_LONG_TESTS") == "1"

# --- what a request holds -------------------------------------------------------------------------------------

MARKUP = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>", "<|im_start|>",
          "<|im_start|>assistant\n", "<tool_response>", "</tool_response>", "<function=get_weather>",
          "</function>", "<parameter=city>", "</parameter>", "<|endoftext|>", "<|vision_start|>", "{{ messages }}",
          "{% endfor %}", '{"name": "x", "arguments": {}}']
PHRASES = ["Hello", "What is the weather in Paris?", "Run the tests.", " and then ", "ok", "Thanks!",
           "天気はどうですか", "机器学习", "Ünïcödé ✓", "😀👍🏽", "— ", "1,000.5", "done.", "Zoë naïve café",
           "def f(x):\n    return x\n", "```json\n{}\n```"]
SPACES = ["\n", "\n\n", " ", "  ", "\t", "\r\n"]

words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10)
texts = st.lists(st.one_of(st.sampled_from(PHRASES), st.sampled_from(MARKUP), st.sampled_from(SPACES), words),
                 max_size=6).map("".join)
plain_texts = st.lists(st.one_of(st.sampled_from(PHRASES), words), min_size=1, max_size=4).map("".join)
"""Text with no markup (a description, most prefills)."""

text_parts = st.lists(texts.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3)
contents = st.one_of(texts, texts, text_parts, st.just([]))
user_contents = st.sampled_from([False] * 9 + [True]).flatmap(
    lambda wrapped: texts.map(lambda t: f"<tool_response>{t}</tool_response>") if wrapped else contents)
"""A user message may read like a tool result (Qwen3.5's template then finds no user query in it)."""
prefills = st.one_of(plain_texts, plain_texts, texts, text_parts,
                     st.builds(lambda a, b: a + b, st.sampled_from(SPACES), plain_texts),
                     st.builds(lambda a, b: a + b, plain_texts, st.sampled_from(SPACES)))
"""What a continued assistant message holds: a prefill, sometimes with markup, blank or edged with whitespace."""

names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,14}", fullmatch=True)
keys = st.one_of(names, st.sampled_from(["city", "path", "q", "ünï", "a b", "x.y"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(keys, inner, max_size=3)), max_leaves=8)
argument_objects = st.dictionaries(keys, json_values, max_size=4)
arguments = st.one_of(
    st.builds(lambda obj, ascii_, indent: json.dumps(obj, ensure_ascii=ascii_, indent=indent),
              argument_objects, st.booleans(), st.sampled_from([None, 2])),
    st.just(""), argument_objects)
"""A JSON string (as OpenAI's API sends them), sometimes blank, or an object (as vLLM also takes them)."""

schemas = st.recursive(
    st.builds(lambda kind, desc: {"type": kind, **({"description": desc} if desc else {})},
              st.sampled_from(["string", "integer", "number", "boolean"]), st.one_of(st.none(), plain_texts)),
    lambda inner: st.one_of(
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]},
                  st.dictionaries(keys, inner, max_size=3))),
    max_leaves=6)


@st.composite
def tool_lists(draw) -> list[dict]:
    tool_names = draw(st.lists(names, max_size=4, unique=True))
    tools: list[dict] = []
    for name in tool_names:
        fn = {"name": name}
        if draw(st.booleans()):
            fn["description"] = draw(texts)
        props = draw(st.dictionaries(keys, schemas, max_size=3))
        fn["parameters"] = {"type": "object", "properties": props, "required": sorted(props)[:1]}
        tools.append({"type": "function", "function": fn})
    return tools


class CallIds:
    """The ids of one conversation's tool calls, in order."""

    def __init__(self):
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return f"call_{self.n}"


@st.composite
def assistant_messages(draw, tool_names: list[str], ids: CallIds, calls: bool) -> dict:
    m = {"role": "assistant"}
    content = draw(st.sampled_from(["absent", "null", "empty", "text", "parts", "inline_think"]))
    if content == "null":
        m["content"] = None
    elif content == "empty":
        m["content"] = ""
    elif content == "text":
        m["content"] = draw(texts)
    elif content == "parts":
        m["content"] = draw(text_parts)
    elif content == "inline_think":
        m["content"] = f"<think>\n{draw(texts)}\n</think>\n\n{draw(texts)}"
    reasoning = draw(st.sampled_from([None, "reasoning_content", "reasoning"]))
    if reasoning is not None:
        m[reasoning] = draw(texts)
    if calls:
        m["tool_calls"] = []
        for _ in range(draw(st.integers(1, 3))):
            call = {"type": "function", "function": {"name": draw(st.sampled_from(tool_names)),
                                                     "arguments": draw(arguments)}}
            if draw(st.integers(0, 5)):
                call = {"id": ids.next(), **call}
            m["tool_calls"].append(call)
    elif content == "absent" and draw(st.booleans()):
        m["content"] = draw(texts)
    return m


def tool_results(draw, call_message: dict) -> list[dict]:
    """One result per call, or (sometimes) fewer or one more, each naming a call of ``call_message``."""
    calls = call_message["tool_calls"]
    count = draw(st.sampled_from([len(calls), len(calls), 1, len(calls) + 1]))
    out = []
    for i in range(count):
        m = {"role": "tool", "content": draw(contents)}
        call_id = calls[min(i, len(calls) - 1)].get("id")
        if call_id is not None:
            m["tool_call_id"] = call_id
        out.append(m)
    return out


@st.composite
def requests(draw, max_turns: int = 3) -> dict:
    """A chat request body an agent could send."""
    tools = draw(tool_lists())
    tool_names = [t["function"]["name"] for t in tools] or ["lookup"]
    ids = CallIds()
    messages = []
    head = draw(st.sampled_from([None, "system", "system", "developer"]))
    if head is not None:
        messages.append({"role": head, "content": draw(contents)})
    turns = draw(st.integers(0 if messages and draw(st.integers(0, 19)) == 0 else 1, max_turns))
    for turn in range(turns):
        if turn and draw(st.integers(0, 6)) == 0:
            messages.append({"role": draw(st.sampled_from(["developer", "developer", "system"])),
                             "content": draw(contents)})
        user = {"role": "user", "content": draw(user_contents)}
        if draw(st.integers(0, 9)) == 0:
            user["name"] = draw(names)
        messages.append(user)
        for _ in range(draw(st.integers(0, 2))):
            call = draw(assistant_messages(tool_names, ids, calls=True))
            messages.append(call)
            messages.extend(tool_results(draw, call))
        if turn < turns - 1:
            messages.append(draw(assistant_messages(tool_names, ids, calls=False)))
    body = {"model": "m", "messages": messages}
    if tools or draw(st.booleans()):
        body["tools"] = tools
    thinking = draw(st.sampled_from(["absent", True, False]))
    if thinking != "absent":
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    ending = draw(st.sampled_from(["generate", "generate", "generate", "continue", "bare"]))
    if ending == "generate" and draw(st.booleans()):
        body["add_generation_prompt"] = True
    elif ending == "continue":
        final = {"role": "assistant", "content": draw(prefills)}
        if draw(st.integers(0, 3)) == 0:
            final["reasoning_content"] = draw(texts)
        if draw(st.integers(0, 9)) == 0:
            final["tool_calls"] = draw(assistant_messages(tool_names, ids, calls=True))["tool_calls"]
        messages.append(final)
        body["continue_final_message"] = True
        opener = draw(st.sampled_from(["absent", False, False, True]))  # true with it: refused (transformers too)
        if opener != "absent":
            body["add_generation_prompt"] = opener
    elif ending == "bare":
        if draw(st.booleans()):
            messages.append(draw(assistant_messages(tool_names, ids, calls=False)))
        body["add_generation_prompt"] = False
    return body


# --- the reference ---------------------------------------------------------------------------------------------

def as_vllm_hands_them(raw: list[dict], joins_parts: bool, late_system: bool) -> list[dict]:
    """The request's messages as vLLM hands them to ``apply_chat_template``: arguments parsed into objects,
    text parts joined by newlines for a template that reads a content as a string (a tool result's whatever
    the template reads), an absent content of an assistant message without calls as ""; developer messages
    placed as the gateway's in-place policy places them (a system turn first, or where the template renders a
    late one; else a user turn)."""
    out = []
    for i, m in enumerate(copy.deepcopy(raw)):
        content = m.get("content")
        if isinstance(content, list) and (joins_parts or m["role"] == "tool"):
            content = "\n".join(p["text"] for p in content)
        if m["role"] == "developer":
            if i == 0 or late_system:
                m["role"] = "system"
            else:
                text = content if isinstance(content, str) else "".join(p["text"] for p in content)
                m["role"], content = "user", DEVELOPER_TURN_PREFIX + text
        if content is None and m["role"] == "assistant" and not m.get("tool_calls"):
            content = ""
        m["content"] = content
        for call in m.get("tool_calls", ()):
            args = call["function"]["arguments"]
            if isinstance(args, str):
                call["function"]["arguments"] = json.loads(args) if args else {}
        out.append(m)
    return out


def reference(rig, body: dict) -> tuple[str, list[int]] | Exception:
    """transformers' prompt text and ids for ``body``, or what it raised."""
    template = rig.template
    continuing = bool(body.get("continue_final_message"))
    kwargs = dict(body.get("chat_template_kwargs") or {})
    messages = as_vllm_hands_them(body["messages"], template.joins_parts, template.takes_late_system)
    args = dict(tools=body.get("tools"), chat_template=template.source, continue_final_message=continuing,
                add_generation_prompt=body.get("add_generation_prompt", not continuing), **kwargs)
    try:
        text = rig.hf.apply_chat_template(messages, tokenize=False, **args)
        ids = rig.hf.apply_chat_template(messages, tokenize=True, return_dict=False, **args)
    except Exception as e:  # the template's refusal, or transformers' own (a continued text it cannot find)
        return e
    return text, list(ids)


# --- the gateway ---------------------------------------------------------------------------------------------

def chat_prompt(rig, body: dict):
    """The prompt /v1/chat/completions renders for ``body``, in the order its handler builds it."""
    f = Fields(copy.deepcopy(body))
    messages = parse_messages(f)
    check_tool_results(messages)
    messages = apply_developer_policy(messages, "in-place", rig.template.takes_late_system)
    tools = parse_tools(f)
    render_tools = prompt_tools(tools, parse_tool_choice(f, tools), False)
    continuing, opener = _continues(f)
    kwargs = template_kwargs(f)
    with rendering_errors():
        prompt = build_chat_prompt(rig.template, rig.tok, messages, render_tools, kwargs, continuing, opener)
        part_end(rig.template, rig.tok, messages[:-1] if continuing else messages, render_tools, kwargs,
                 prompt.ids, prompt.opener_start)
    return prompt


def tokenize_ids(rig, body: dict) -> list[int]:
    """What /tokenize counts for ``body``."""
    gw = types.SimpleNamespace(template=rig.template, tokenizer=rig.tok, config=types.SimpleNamespace(
        server_developer_message_policy="in-place", exclude_tools_when_tool_choice_none=False,
        tool_call_parser="auto"))
    return render_chat_ids(gw, Fields(copy.deepcopy(body)))


def continues_no_text(body: dict) -> bool:
    """The final message to continue has no text, or calls tools: the gateway refuses to continue it
    (``gateway.continuation``), where transformers continues an empty text, or cuts the calls off."""
    if not body.get("continue_final_message"):
        return False
    final = body["messages"][-1]
    content = final.get("content")
    text = "".join(p["text"] for p in content) if isinstance(content, list) else content or ""
    return final["role"] == "assistant" and (bool(final.get("tool_calls")) or not text.strip())


def continued_text_not_rendered(rig, body: dict, expected: tuple[str, list[int]]) -> bool:
    """transformers continued a final message whose text its turn does not render as given (a ``</think>``
    inside it splits reasoning off): its check, that the stripped text of the message's last text part appears
    anywhere in the chat, passed on an earlier message holding the same text, or on a blank last part. The
    gateway continues only a text the final turn renders (else a 400), as transformers does when its check
    looks at the whole text."""
    if not body.get("continue_final_message"):
        return False
    template = rig.template
    messages = as_vllm_hands_them(body["messages"], template.joins_parts, template.takes_late_system)
    content = messages[-1]["content"]
    final = content if isinstance(content, str) else "".join(p["text"] for p in content)
    try:
        before = rig.hf.apply_chat_template(messages[:-1], tools=body.get("tools"), tokenize=False,
                                            chat_template=template.source,
                                            **dict(body.get("chat_template_kwargs") or {}))
    except Exception:  # the turns before it alone are refused: the text is looked for in the whole prompt
        before = ""
    text = expected[0]
    return final.strip() not in text[len(os.path.commonprefix([before, text])):]


def cut_apart_by_whitespace(body: dict, got: str, expected: str) -> bool:
    """A known difference, ``gateway.continuation``'s: a continued prompt that differs from transformers' only in
    whitespace at the cut. The gateway cuts right after the message's text where its turn renders it;
    transformers cuts where a tag written after the text lands, past what the template writes after a
    ``</think>`` the text ends with (``"</think>\n\n"``), and keeps a trailing space the template keeps where
    the text's leading newlines were stripped (Qwen3-Next's ``content.lstrip('\n')``)."""
    return bool(body.get("continue_final_message")) and got != expected and got.rstrip() == expected.rstrip()


def check(rig, body: dict) -> None:
    expected = reference(rig, body)
    if isinstance(expected, Exception) or continues_no_text(body) or continued_text_not_rendered(rig, body, expected):
        for path in (chat_prompt, tokenize_ids):
            with pytest.raises(ApiError) as refused:
                path(rig, body)
            assert refused.value.status == 400, (path.__name__, refused.value.message, repr(expected))
        return
    text, ids = expected
    prompt = chat_prompt(rig, body)
    if cut_apart_by_whitespace(body, prompt.text, text):
        return
    assert prompt.text == text
    if prompt.ids != ids:
        # transformers rebuilds the BPE, and for qwen3_5 with a split pattern lacking combining marks
        # (test_real_tokenizer_loading): where it tokenizes this text unlike tokenizer.json, the file's ids hold
        file_ids = rig.file_tokenizer.encode(text, add_special_tokens=False).ids
        assert file_ids != ids, "transformers tokenizes this text as tokenizer.json does: the ids differ otherwise"
        ids = file_ids
    assert prompt.ids == ids
    assert tokenize_ids(rig, body) == ids


# --- fixtures and the properties ------------------------------------------------------------------------------

class Rig(types.SimpleNamespace):
    """One family: its template as the gateway compiles it, the gateway's tokenizer, transformers' tokenizer,
    and tokenizer.json loaded apart from the gateway."""


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def rig(request, real_tokenizer_dir):
    try:
        source = chat_template(request.param)
    except TemplateMissing as e:
        pytest.skip(str(e))
    path = real_tokenizer_dir(request.param)
    tok = load_model_files(path).tokenizer
    return Rig(template=ChatTemplate(source, tok.special_tokens_map()), tok=tok,
               hf=transformers.AutoTokenizer.from_pretrained(str(path)),
               file_tokenizer=tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")))


def _explore(rig, examples: int, max_turns: int) -> None:
    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(body=requests(max_turns))
    def run(body):
        note(json.dumps(body, ensure_ascii=True))  # the request as sent, to replay a failure with ``check``
        check(rig, body)

    run()


def test_random_conversations_render_as_transformers_renders_them(rig):
    _explore(rig, examples=30, max_turns=3)


@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="long mode: IGNIS_LONG_TESTS=1")
def test_random_conversations_render_as_transformers_renders_them_long(rig):
    _explore(rig, examples=2000, max_turns=6)
