"""The Qwen3.5 XML tool-call format: typed values, streaming fragments, several calls, malformed blocks, forcing."""

from __future__ import annotations

import json
import random

import pytest

from ignis.gateway.output_parser import ForcedCall
from ignis.gateway.tool_call_xml import parameter_types, parse_xml_block, typed_value
from tests.gateway.parser_helpers import every_split, parse

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "ratio": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
        "note": {"type": ["string", "null"]}, "any": {"anyOf": [{"type": "array"}, {"type": "string"}]},
        "text": {"description": "no type said"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def xml(text, **kwargs):
    return every_split(text, tool_format="qwen3_xml", tools=TOOLS, **kwargs)


def test_typed_parameters():
    text = call("get_weather", city="Paris", days="3", ratio="0.5", metric="true", opts='{"unit": "C"}',
                tags='["a", "b"]', note="null", any="[1]", text="null")
    r = xml(text)
    assert r["content"] == "" and len(r["calls"]) == 1 and r["calls"][0]["name"] == "get_weather"
    assert json.loads(r["calls"][0]["arguments"]) == {
        "city": "Paris", "days": 3, "ratio": 0.5, "metric": True, "opts": {"unit": "C"}, "tags": ["a", "b"],
        "note": None, "any": [1], "text": "null"}


def test_strings_stay_strings_and_bad_json_falls_back_to_the_string():
    r = xml(call("get_weather", city="42", days="three", opts="{broken", note="  spaced  "))
    assert json.loads(r["calls"][0]["arguments"]) == {"city": "42", "days": "three", "opts": "{broken",
                                                     "note": "  spaced  "}


def test_multiline_value_keeps_its_inner_newlines():
    r = xml(call("get_weather", city="line one\nline two\n"))
    assert json.loads(r["calls"][0]["arguments"]) == {"city": "line one\nline two\n"}


def test_unknown_tool_and_parameter_values_are_strings():
    r = xml(call("search", q="7", limit="10"))
    assert r["calls"] == [{"name": "search", "arguments": '{"q": "7", "limit": "10"}'}]


def test_several_calls_with_content_before_and_reasoning():
    text = ("<think>\nneed both\n</think>\n\nChecking.\n" + call("get_weather", city="Oslo") + "\n"
            + call("get_time") + "\n")
    r = xml(text)
    assert r["reasoning"] == "need both\n" and r["content"] == "Checking.\n"
    assert [c["name"] for c in r["calls"]] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in r["calls"]] == [{"city": "Oslo"}, {}]
    assert r["num_tool_calls"] == 2


def test_arguments_stream_one_fragment_per_parameter():
    from ignis.gateway.output_parser import OutputParser

    p = OutputParser(tool_format="qwen3_xml", tools=TOOLS)
    seen = p.push("<tool_call>\n<function=get_weather>\n")
    assert [(e.id is not None, e.name, e.arguments) for _, e in seen] == [(True, "get_weather", "")]
    seen = p.push("<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2")
    assert [e.arguments for _, e in seen] == ['{"city": "Rome"']
    seen = p.push("\n</parameter>\n</function>\n</tool_call>")
    assert [e.arguments for _, e in seen] == [', "days": 2', "}"]
    assert p.finish() == []


def test_lenient_endings_of_values():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n<parameter=days>\n4\n"
            "</function>\n</tool_call>")
    r = xml(text)
    assert json.loads(r["calls"][0]["arguments"]) == {"city": "Lima", "days": 4}


@pytest.mark.parametrize("text", [
    "<tool_call>\nnot a call at all\n</tool_call>",
    "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
    "<tool_call><tool_call></tool_call>",
])
def test_malformed_blocks_are_content_as_written(text):
    r = xml(text)
    assert r["calls"] == [] and r["content"] == text


def test_malformed_block_between_good_calls():
    text = call("get_time") + "<tool_call>\noops\n</tool_call>" + call("get_time")
    r = xml(text)
    assert [c["name"] for c in r["calls"]] == ["get_time", "get_time"]
    assert r["content"] == "<tool_call>\noops\n</tool_call>"


def test_a_hermes_block_is_understood_by_the_xml_parser():
    r = xml('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>')
    assert r["calls"] == [{"name": "get_weather", "arguments": '{"city": "Bern"}'}]


def test_output_ending_inside_a_call():
    r = xml("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa")
    assert r["calls"] == [{"name": "get_weather", "arguments": "{}"}]  # the value cut off is dropped
    r = xml("<tool_call>\n<function=get_we")
    assert r["calls"] == [] and r["content"] == "<tool_call>\n<function=get_we"
    # after a call, another cut off before its name is a cut call, not content sent back before the calls
    for cut in ("\n<tool_call>\n<function", "\n<tool_call>", "\n<tool_call>\n<function=get_we"):
        r = xml("Sure." + call("get_time") + cut)
        assert r["calls"] == [{"name": "get_time", "arguments": "{}"}] and r["content"] == "Sure.", cut


def test_forced_named_call_starts_inside_the_call():
    body = "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\nDone."
    r = xml(body, forced=ForcedCall("get_weather"))
    assert r["calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert r["content"] == "\nDone."
    garbage = xml("zq 17 <<>> </ nonsense", forced=ForcedCall("get_weather"))
    assert garbage["calls"] == [{"name": "get_weather", "arguments": "{}"}]


def test_forced_any_call_starts_in_a_block():
    r = xml("<function=get_time>\n</function>\n</tool_call>", forced=ForcedCall())
    assert r["calls"] == [{"name": "get_time", "arguments": "{}"}]
    r = xml("I will not call anything.", forced=ForcedCall())
    assert r["calls"] == [] and r["content"] == "I will not call anything."


def test_forced_call_ignores_think_markers():
    r = xml("<think>x</think></function>\n</tool_call>", forced=ForcedCall("get_time"))
    assert r["reasoning"] == "" and r["calls"] == [{"name": "get_time", "arguments": "{}"}]


def test_parameter_types_and_typed_value():
    types = parameter_types(TOOLS)
    assert types["get_weather"]["note"] == {"string", "null"} and types["get_weather"]["any"] == set()
    assert types["get_weather"]["text"] == {"string"}  # a schema that says nothing of its type: raw text
    assert typed_value("5", {"integer"}) == 5 and typed_value("5", {"string"}) == "5"
    assert typed_value("False", {"boolean"}) is False and typed_value("maybe", {"boolean"}) == "maybe"
    assert parse_xml_block("<function=f>\n</function>", types) == ("f", "{}")
    assert parse_xml_block("{}", types) is None


def test_whole_and_piecewise_parse_agree_on_a_long_turn():
    text = "Sure.\n" + "\n".join(call("get_weather", city=f"C{i}", days=str(i)) for i in range(5))
    r = parse([text], tool_format="qwen3_xml", tools=TOOLS)
    assert [json.loads(c["arguments"])["days"] for c in r["calls"]] == [0, 1, 2, 3, 4]


PIECES = [
    "Plain words. ", "\n", call("get_weather", city="Paris", days="2"), call("get_time"),
    "<tool_call>\nnot a call\n</tool_call>", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nA <b>tag</b> & </param\n</parameter>\n</function>\n"
    "</tool_call>", "a < b <tool", " <function=x> ",
]


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
@pytest.mark.parametrize("seed", range(12))
def test_random_turns_parse_the_same_however_they_are_split(seed, fmt):
    """Mixed turns (either format, malformed blocks, near-markers), in both parsers."""
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5)))
    if rng.random() < 0.5:
        text = "<think>\nfirst " + rng.choice(PIECES) + "\n</think>\n\n" + text
    r = every_split(text, tool_format=fmt, tools=TOOLS)
    assert r["num_tool_calls"] == len(r["calls"])
    for c in r["calls"]:
        assert isinstance(json.loads(c["arguments"]), dict)


def test_a_parameter_written_twice_keeps_its_first_value():
    r = xml("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    assert r["calls"][0]["arguments"] == '{"city": "Paris", "days": 2}'


@pytest.mark.parametrize("value", ['{"a": Infinity}', "[1e999, 1]", '{"a": NaN}', '{"k": "x\\ud800y"}',
                                   '{"\\udc00": 1}'])
def test_json_a_response_cannot_carry_stays_the_raw_string(value):
    """NaN, Infinity, a number that overflows to one, a lone surrogate: not JSON (the response could not be
    written), so an object or array parameter holding one is its raw text."""
    param = "tags" if value.startswith("[") else "opts"
    r = xml(call("get_weather", **{param: value}))
    assert json.loads(r["calls"][0]["arguments"]) == {param: value}
    r["calls"][0]["arguments"].encode("utf-8")
