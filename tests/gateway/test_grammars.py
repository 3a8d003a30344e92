"""Grammars on Qwen's real vocabularies, token by token: forced tool calls, and answers after reasoning.

Each case tokenizes a remainder as the model would write it (added tokens
such as ``</tool_call>`` as themselves) and feeds it to an ``LLMatcher`` of
``tool_call_grammar``: a well-formed call is consumed to the end, where only
the end-of-sequence tokens remain allowed; a malformed one is stopped at the
first token the grammar does not allow.
"""

from __future__ import annotations

import numpy as np
import pytest

from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.gateway.grammars import (
    after_reasoning,
    any_tool_call_grammar,
    choice_grammar,
    grammar_error,
    json_schema_grammar,
    tool_call_grammar,
    tool_calls_grammar,
)
from tests.support.real_tokenizer import token_ids

llguidance = pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
    "required": ["city", "days"]}}}


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def vocab(request, real_tokenizer_dir):
    family = request.param
    ids = token_ids(family)
    eos = (ids["<|im_end|>"], ids["<|endoftext|>"])
    return load_tokenizer(real_tokenizer_dir(family), max(ids.values()) + 1, eos), eos


def consumed(vocab, grammar: str, text: str) -> tuple[int, int, object]:
    """(tokens consumed, tokens in ``text``, the matcher after them)."""
    tok, _ = vocab
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tok.tokenize_str(text, parse_special=True)
    return matcher.try_consume_tokens(ids), len(ids), matcher


def only_eos_left(vocab, matcher) -> bool:
    tok, eos = vocab
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return matcher.is_accepting() and sorted(np.nonzero(bits)[0].tolist()) == sorted(eos)


XML_OK = [
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "<parameter=city>\nSaint <b>Malo</b>\nen Bretagne\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
    "<parameter=days>\n7\n</parameter>\n<parameter=where>\n{\"lat\": 48.6}\n</parameter>\n</function>\n</tool_call>",
]
XML_BAD = [
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",  # city is required
    "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",  # days is required
    "<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n",  # not in the enum
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\nthree\n</parameter>\n",  # not an integer
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n9\n</parameter>\n",  # above the maximum
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=mood>\nok\n",  # unknown
    "<parameter=city>\nParis</tool_call>\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
    "</tool_call>",  # the block's close inside a value, where the splitter ends the call
]
HERMES_OK = ['{"city": "Paris", "days": 3}}\n</tool_call>', ' {"city": "Paris", "days": 3}}\n</tool_call>',
             '{"city": "Saint-Malo", "unit": "f", "days": 1, "where": {"lat": 48.6}}}\n</tool_call>']
HERMES_BAD = ['{"days": 3}}\n</tool_call>', '{"city": "Paris", "days": "3"}}\n</tool_call>',
              '{"city": "Paris", "days": 3}\n</tool_call>', '{"city": "Paris", "days": 3, "x": 1}}\n</tool_call>']


@pytest.mark.parametrize("parser,text", [("xml", t) for t in XML_OK] + [("hermes", t) for t in HERMES_OK])
def test_a_well_formed_call_is_consumed_to_the_end_and_only_eos_follows(vocab, parser, text):
    grammar = tool_call_grammar(WEATHER, parser)
    assert grammar_error(grammar) == ""
    n, total, matcher = consumed(vocab, grammar, text)
    assert n == total
    assert only_eos_left(vocab, matcher)


@pytest.mark.parametrize("parser,text", [("xml", t) for t in XML_BAD] + [("hermes", t) for t in HERMES_BAD])
def test_a_malformed_call_is_stopped(vocab, parser, text):
    params = WEATHER["function"]["parameters"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": dict(
        params, additionalProperties=False)}}
    n, total, matcher = consumed(vocab, tool_call_grammar(tool, parser), text)
    assert n < total or not matcher.is_accepting()


@pytest.mark.parametrize("extra, taken", [({}, False), ({"additionalProperties": True}, True),
                                          ({"additionalProperties": {"type": "integer"}}, True)])
def test_hermes_argument_names_are_the_schemas_unless_it_allows_others(vocab, extra, taken):
    """As in the XML format, a call names only the schema's parameters, unless the schema says otherwise."""
    params = WEATHER["function"]["parameters"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {**params, **extra}}}
    n, total, matcher = consumed(vocab, tool_call_grammar(tool, "hermes"),
                                 '{"city": "Paris", "days": 3, "x": 1}}\n</tool_call>')
    assert (n == total and matcher.is_accepting()) is taken


def test_a_tool_without_parameters_closes_at_once(vocab):
    tool = {"type": "function", "function": {"name": "now"}}
    n, total, matcher = consumed(vocab, tool_call_grammar(tool, "xml"), "</function>\n</tool_call>")
    assert n == total and only_eos_left(vocab, matcher)
    n, total, matcher = consumed(vocab, tool_call_grammar(tool, "hermes"), "{}}\n</tool_call>")
    assert n == total and only_eos_left(vocab, matcher)


def test_unusable_tools_and_parsers_raise():
    with pytest.raises(ValueError, match="tool parser"):
        tool_call_grammar(WEATHER, "json")
    with pytest.raises(ValueError, match="parameter name"):
        tool_call_grammar({"function": {"name": "f", "parameters": {"properties": {"a>b": {}}}}}, "xml")
    with pytest.raises(ValueError, match="parameters must be an object"):
        tool_call_grammar({"function": {"name": "f", "parameters": [1]}}, "hermes")
    with pytest.raises(ValueError, match="at least one tool"):
        any_tool_call_grammar([], "xml")
    with pytest.raises(ValueError, match="no name"):
        any_tool_call_grammar([{"function": {"parameters": {}}}], "hermes")


@pytest.mark.parametrize("text,complete", [
    ('Let me think: {"a": "x"}?\n</think>\n\n{"a": 1}', True),
    ('</think>{"a": 1}', True),
    ('Thinking.\n</think>\n\nThe answer is 1.', False),
    ('{"a": 1}', False),  # no reasoning block closed: the JSON is still reasoning text
])
def test_after_reasoning_leaves_the_thought_free_and_holds_the_answer(vocab, text, complete):
    grammar = after_reasoning(json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}},
                                                   "required": ["a"]}))
    assert grammar_error(grammar) == ""
    n, total, matcher = consumed(vocab, grammar, text)
    assert (n == total and only_eos_left(vocab, matcher)) is complete


def test_after_reasoning_takes_a_tool_call_grammar_too(vocab):
    grammar = after_reasoning(tool_call_grammar(WEATHER, "hermes"))
    n, total, matcher = consumed(vocab, grammar, 'Call it.</think>\n{"city": "Rome", "days": 2}}\n</tool_call>')
    assert n == total and only_eos_left(vocab, matcher)


NOW = {"type": "function", "function": {"name": "now"}}


@pytest.mark.parametrize("parser,text,ok", [
    ("qwen3_xml", "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
                  "</function>\n</tool_call>", True),
    ("xml", "<function=now>\n</function>\n</tool_call>", True),
    ("xml", "<function=later>\n</function>\n</tool_call>", False),  # not among the tools
    ("xml", "<function=get_weather>\n</function>\n</tool_call>", False),  # its required parameters are missing
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>', True),
    ("hermes", '{"name": "now", "arguments": {}}\n</tool_call>', True),
    ("hermes", '{"name": "later", "arguments": {}}\n</tool_call>', False),
    ("hermes", '{"name": "now", "arguments": {}}', False),  # not closed
])
def test_a_required_call_is_one_of_the_tools_with_its_arguments(vocab, parser, text, ok):
    grammar = any_tool_call_grammar([WEATHER, NOW], parser)
    assert grammar_error(grammar) == ""
    n, total, matcher = consumed(vocab, grammar, text)
    assert (n == total and only_eos_left(vocab, matcher)) is ok


def test_a_real_agent_clients_tools_can_be_required(vocab):
    """Qwen Code's tool set holds a oneOf: the library holds it as anyOf, so a required call compiles, and a
    value valid under one branch goes through."""
    from tests.support.replay import QWEN_CODE_TRACE, load_trace

    if not QWEN_CODE_TRACE.is_file():
        pytest.skip(f"{QWEN_CODE_TRACE} is absent")
    tools = load_trace(QWEN_CODE_TRACE, limit=1)[0].body["tools"]
    assert any('"oneOf"' in str(t).replace("'", '"') for t in tools)
    for parser in ("xml", "hermes"):
        assert grammar_error(any_tool_call_grammar(tools, parser)) == "", parser
    one_of = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "string", "enum": ["all"]}]}},
        "required": ["n"]}}}
    for text, ok in (('{"n": 3}}\n</tool_call>', True), ('{"n": "all"}}\n</tool_call>', True),
                     ('{"n": "some"}}\n</tool_call>', False)):
        n, total, matcher = consumed(vocab, tool_call_grammar(one_of, "hermes"), text)
        assert (n == total and only_eos_left(vocab, matcher)) is ok, text


def test_lenient_grammars_leave_unsupported_keywords_unenforced_and_keep_the_rest(vocab):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}, "b": {"type": "string", "format": "zzz"},
                                         "c": {"type": "integer"}}, "required": ["c"]}}}
    assert "not" in grammar_error(tool_call_grammar(tool, "hermes"))
    lenient = tool_call_grammar(tool, "hermes", lenient=True)
    assert grammar_error(lenient) == ""
    n, total, matcher = consumed(vocab, lenient, '{"a": 1, "b": "x", "c": 2}}\n</tool_call>')
    assert n == total and only_eos_left(vocab, matcher)
    n, total, _ = consumed(vocab, lenient, '{"a": 1, "c": "two"}}\n</tool_call>')
    assert n < total  # c is still an integer
    broken = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}
    assert grammar_error(tool_call_grammar(broken, "hermes", lenient=True))  # what cannot be built still fails


XML_WEATHER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
                    "</parameter>\n</function>\n</tool_call>")
HERMES_WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'


@pytest.mark.parametrize("parser,text,held,ok", [
    ("xml", "It is sunny in Oslo, no tool needed.", {"get_weather"}, True),
    ("xml", "Let me look.\n" + XML_WEATHER_CALL, {"get_weather"}, True),
    ("xml", XML_WEATHER_CALL + "\n" + XML_WEATHER_CALL + "\nDone.", {"get_weather"}, True),  # two calls, then text
    ("xml", "<tool_call>\n<function=now>\n</function>\n</tool_call>", set(), True),  # not held: free arguments
    ("xml", "<tool_call>\n<function=now>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>", set(),
     True),
    ("xml", "<tool_call>\n<function=later>\n</function>\n</tool_call>", set(), False),  # not among the tools
    ("xml", XML_WEATHER_CALL.replace("2\n", "two\n"), {"get_weather"}, False),  # held: days is an integer
    ("xml", XML_WEATHER_CALL.replace("2\n", "two\n"), set(), True),  # not held
    ("xml", "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", {"get_weather"}, False),
    ("hermes", "Sure.\n" + HERMES_WEATHER_CALL, {"get_weather"}, True),
    ("hermes", HERMES_WEATHER_CALL.replace("2}", '"2"}'), {"get_weather"}, False),
    ("hermes", HERMES_WEATHER_CALL.replace("2}", '"2"}'), set(), True),
    ("hermes", '<tool_call>\n{"name": "later", "arguments": {}}\n</tool_call>', set(), False),
])
def test_auto_calls_are_free_text_with_calls_of_the_tools_held_where_strict(vocab, parser, text, held, ok):
    grammar = tool_calls_grammar([WEATHER, NOW], parser, held)
    assert grammar_error(grammar) == ""
    n, total, matcher = consumed(vocab, grammar, text)
    assert (n == total and matcher.is_accepting()) is ok, (n, total)


def test_allowed_tools_leave_the_others_out_of_auto_calls(vocab):
    grammar = tool_calls_grammar([NOW], "xml", set())  # allowed: now (get_weather stays in the prompt)
    n, total, _ = consumed(vocab, grammar, "Checking.\n" + XML_WEATHER_CALL)
    assert n < total
    n, total, matcher = consumed(vocab, grammar, "Checking.\n<tool_call>\n<function=now>\n</function>\n</tool_call>")
    assert n == total and matcher.is_accepting()
    grammar = after_reasoning(tool_calls_grammar([WEATHER], "xml", {"get_weather"}))
    n, total, matcher = consumed(vocab, grammar, "I could call <tool_call> anything here.</think>\n\n"
                                                 + XML_WEATHER_CALL)
    assert n == total and matcher.is_accepting()


def test_thousands_of_choices_sharing_a_prefix_are_held_whole(vocab):
    # as alternatives of a rule, the parser gave up on the first token once 2,000 of them were open
    # ("Current row has 20001 items"): the matcher failed and the request was ended as if complete
    many = [f"entry {i} of a long list" for i in range(3000)]
    for text in (many[0], many[2999]):
        done, total, m = consumed(vocab, choice_grammar(many), text)
        assert done == total and only_eos_left(vocab, m), m.get_error()
    done, total, m = consumed(vocab, choice_grammar(many), "entry 3000 of a long list")
    assert done < total
    for text, ok in (("", True), ("a", True), ("ab", True), ("b", False)):
        done, total, m = consumed(vocab, choice_grammar(["", "a", "ab"]), text)
        assert (done == total and m.is_accepting()) == ok, text
    enum = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"item": {"enum": many}}, "required": ["item"]}}}
    call = f"<parameter=item>\n{many[2999]}\n</parameter>\n</function>\n</tool_call>"
    done, total, m = consumed(vocab, tool_call_grammar(enum, "xml"), call)
    assert done == total and only_eos_left(vocab, m), m.get_error()
    done, total, m = consumed(vocab, tool_call_grammar(enum, "xml"), call.replace("2999", "3999"))
    assert done < total


PYDANTIC_STYLE = {"type": "function", "function": {"name": "add_items", "parameters": {
    "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                       "required": ["sku", "qty"]}},
    "definitions": {"Mode": {"enum": ["fast", "safe"]}},
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                   "mode": {"$ref": "#/definitions/Mode"}, "note": {"type": "string"}},
    "required": ["items", "mode"]}}}


@pytest.mark.parametrize("parser,text,ok", [
    ("xml", '<parameter=items>\n[{"sku": "a1", "qty": 2}]\n</parameter>\n<parameter=mode>\n"safe"\n</parameter>\n'
            "</function>\n</tool_call>", True),
    ("xml", '<parameter=items>\n[{"sku": "a1", "qty": "2"}]\n</parameter>\n', False),  # qty is an integer
    ("hermes", '{"items": [{"sku": "a1", "qty": 2}], "mode": "fast"}}\n</tool_call>', True),
])
def test_parameters_pointing_into_the_roots_definitions_are_held(vocab, parser, text, ok):
    """Pydantic's and MCP tools' schemas name their shapes in the root's $defs (or definitions): an XML
    parameter's rule is a schema of its own, so the root's definitions go with it."""
    grammar = tool_call_grammar(PYDANTIC_STYLE, parser)
    assert grammar_error(grammar) == ""
    assert grammar_error(any_tool_call_grammar([PYDANTIC_STYLE, WEATHER], parser)) == ""
    n, total, matcher = consumed(vocab, grammar, text)
    assert (n == total and only_eos_left(vocab, matcher)) if ok else n < total
