"""vLLM's structured-output fields parsed into a grammar: each form, what its grammar lets through on Qwen's
real vocabulary, and a 400 naming the field for each refusal.

``matches(grammar, text)`` feeds ``text``'s tokens to an ``LLMatcher``: true when every token is taken and
the grammar is then complete.
"""

from __future__ import annotations

import json

import pytest

from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.grammars import after_reasoning
from ignis.gateway.params import parse_common
from ignis.gateway.response_format import _remembered, parse_response_format
from ignis.gateway.structured_outputs import MAX_CHOICE_CHARS, MAX_CHOICES, MAX_SOURCE_CHARS
from ignis.shared.wire_fields import MAX_GRAMMAR_CHARS
from tests.support.real_tokenizer import token_ids

llguidance = pytest.importorskip("llguidance")

TRICKY = ['say "hi"', "back\\slash", 'both \\" and \\\\"', "two\nlines", "tab\there", "nul\x00byte", "del\x7f",
          "emoji 😀", "中文", "/slashes/", "a | b", "%ignore", "é", ""]
CODE = r"[0-9]{3}-[a-z]{2}"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok(real_tokenizer_dir):
    ids = token_ids("qwen3_5")
    return load_tokenizer(real_tokenizer_dir("qwen3_5"), max(ids.values()) + 1, (ids["<|im_end|>"],))


def matches(tok, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tok.tokenize_str(text, parse_special=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def grammar(body: dict) -> str | None:
    return parse_response_format(Fields(body))


def refusal(body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        grammar(body)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize("body", [{"guided_choice": TRICKY}, {"structured_outputs": {"choice": TRICKY}}])
def test_a_choice_is_exactly_one_of_the_strings_however_they_are_spelled(tok, body):
    g = grammar(body)
    for c in TRICKY:
        assert matches(tok, g, c), c
        assert not matches(tok, g, c + "\x02"), c
    assert not matches(tok, g, "say hi") and not matches(tok, g, 'say \\"hi\\"') and not matches(tok, g, "backslash")


@pytest.mark.parametrize("body", [{"guided_regex": CODE}, {"structured_outputs": {"regex": CODE}}])
def test_a_regex_must_match_the_whole_output(tok, body):
    g = grammar(body)
    assert matches(tok, g, "123-ab")
    for text in ("123-abc", "12-ab", "x123-ab", "123-AB", "123-a"):
        assert not matches(tok, g, text), text


@pytest.mark.parametrize("body", [{"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)},
                                  {"structured_outputs": {"json": SCHEMA}},
                                  {"structured_outputs": {"json": json.dumps(SCHEMA)}}])
def test_a_json_schema_as_an_object_or_as_text(tok, body):
    g = grammar(body)
    assert matches(tok, g, '{"n": 12}')
    assert not matches(tok, g, '{"n": "12"}') and not matches(tok, g, '{"n": 1, "m": 2}')


def test_json_object_is_any_object_and_false_is_no_constraint(tok):
    g = grammar({"structured_outputs": {"json_object": True}})
    assert matches(tok, g, '{"a": [1, "x"]}') and not matches(tok, g, "[1]")
    assert grammar({"structured_outputs": {"json_object": False, "regex": "a"}}) == grammar({"guided_regex": "a"})


@pytest.mark.parametrize("body", [{"guided_grammar": 'start: "yes" | "no" NUM\nNUM: /[0-9]+/'},
                                  {"structured_outputs": {"grammar": 'start: "yes" | "no" NUM\nNUM: /[0-9]+/'}}])
def test_a_lark_grammar(tok, body):
    g = grammar(body)
    assert matches(tok, g, "yes") and matches(tok, g, "no42")
    assert not matches(tok, g, "no") and not matches(tok, g, "maybe")


def test_a_grammar_text_is_read_as_lark_even_when_it_looks_like_llguidance_json():
    e = refusal({"guided_grammar": json.dumps({"grammars": [{"lark_grammar": 'start: "x"'}]})})
    assert e.param == "guided_grammar" and "not a usable Lark grammar" in e.message


def test_a_text_response_format_beside_one_is_no_conflict():
    assert grammar({"response_format": {"type": "text"}, "guided_regex": "a"}) == grammar({"guided_regex": "a"})
    assert grammar({"response_format": {"type": "text"}}) is None and grammar({}) is None


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_parse_common_carries_the_grammar_on_both_endpoints(kind):
    body = dict(CHAT) if kind == "chat" else {"prompt": "x"}
    p = parse_common(Fields(body | {"guided_choice": ["a", "b"]}), {}, kind)
    assert p.grammar == grammar({"guided_choice": ["a", "b"]})


@pytest.mark.parametrize("answer_grammar,answer", [
    ({"guided_choice": ["yes", "no"]}, "no"),
    ({"guided_regex": CODE}, "123-ab"),
    ({"guided_grammar": 'start: "ok" /[0-9]/'}, "ok7"),
])
def test_after_an_open_reasoning_block_the_thought_is_free_and_the_answer_held(tok, answer_grammar, answer):
    g = after_reasoning(grammar(answer_grammar))
    assert matches(tok, g, f"Maybe 999-zz or yes?\n</think>\n\n{answer}")
    assert not matches(tok, g, f"Hm.</think>\n\n{answer}!")


def test_a_regex_sent_again_is_not_checked_again():
    body = {"guided_regex": "[q-z]{7}Q"}
    grammar(body)
    hits = _remembered.cache_info().hits
    grammar(body)
    assert _remembered.cache_info().hits == hits + 1


@pytest.mark.parametrize("body,param,words", [
    ({"structured_outputs": {}}, "structured_outputs", "needs one of json, regex, choice, grammar, json_object"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs", "needs one of"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "needs one of"),
    ({"structured_outputs": ["a"]}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "true or false"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not supported"),
    ({"guided_regex": "[0-9"}, "guided_regex", "unclosed character class"),
    ({"structured_outputs": {"regex": "(?=a)b"}}, "structured_outputs.regex", "look-around"),
    ({"guided_regex": 7}, "guided_regex", "must be a string"),
    ({"guided_regex": "a" * (MAX_SOURCE_CHARS + 1)}, "guided_regex", f"at most {MAX_SOURCE_CHARS}"),
    ({"guided_grammar": "start: foo"}, "guided_grammar", 'unknown name: "foo"'),
    ({"guided_grammar": ""}, "guided_grammar", "no start rule"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar", "GBNF"),
    ({"guided_choice": []}, "guided_choice", "at least one string"),
    ({"guided_choice": "yes"}, "guided_choice", "must be an array"),
    ({"guided_choice": ["a", 1]}, "guided_choice", "item 1 must be a string"),
    ({"guided_choice": ["a"] * (MAX_CHOICES + 1)}, "guided_choice", f"at most {MAX_CHOICES}"),
    ({"guided_choice": ["a", "x" * (MAX_CHOICE_CHARS + 1)]}, "guided_choice", f"item 1 is {MAX_CHOICE_CHARS + 1}"),
    ({"guided_choice": [f"{i:04d}" + "\x01" * (MAX_CHOICE_CHARS - 4) for i in range(MAX_CHOICES)]}, "guided_choice",
     f"at most {MAX_GRAMMAR_CHARS}"),  # distinct: repeated choices are written once
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_json": "[1]"}, "guided_json", "JSON Schema object"),
    ({"guided_json": 3}, "guided_json", "JSON Schema object"),
    ({"structured_outputs": {"json": "[" * 40 + "]" * 40}}, "structured_outputs.json", "nests more than 32"),
    ({"guided_json": {"type": "integr"}}, "guided_json", "integr"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "got guided_regex and guided_choice"),
    ({"guided_json": {}, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex",
     "got guided_json and structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice",
     "got structured_outputs.regex and structured_outputs.choice"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "JSON response_format"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos", "cannot be combined with guided_regex"),
    ({"structured_outputs": {"choice": ["a"]}, "min_tokens": 2}, "min_tokens",
     "cannot be combined with structured_outputs.choice"),
    (CHAT | {"tools": TOOLS, "tool_choice": "required", "guided_choice": ["a"]}, "guided_choice", "tool_choice"),
    (CHAT | {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}, "guided_regex": "a"},
     "guided_regex", "tool_choice"),
])
def test_refusals_are_400s_naming_the_field(body, param, words):
    e = refusal(body)
    assert e.param == param and words in e.message, e.message
    assert e.message.startswith(param), e.message


def test_a_completion_ignores_tool_choice_as_it_does_without_a_grammar():
    assert grammar({"prompt": "x", "tool_choice": "required", "guided_regex": "a"}) == grammar({"guided_regex": "a"})
    assert grammar(CHAT | {"tools": TOOLS, "tool_choice": "auto", "guided_regex": "a"}) is not None
