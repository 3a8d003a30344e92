"""The hermes tool-call format (JSON in <tool_call>): calls, several per turn, malformed blocks, forcing."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.output_parser import ForcedCall, OutputParser
from ignis.gateway.tool_call_hermes import parse_hermes_block
from tests.gateway.parser_helpers import every_split

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def hermes(text, **kwargs):
    return every_split(text, tool_format="hermes", tools=TOOLS, **kwargs)


def test_calls_parsed_with_content_before():
    text = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    r = hermes(text)
    assert r["content"] == "I will check.\n"
    assert [c["name"] for c in r["calls"]] == ["get_weather", "get_time"]
    assert json.loads(r["calls"][0]["arguments"]) == {"city": "Paris", "days": 2}
    assert r["calls"][1]["arguments"] == "{}"


def test_call_after_reasoning():
    r = hermes('<think>need weather</think>\n<tool_call>{"name": "w", "arguments": {"q": 1}}</tool_call>')
    assert r["reasoning"] == "need weather" and r["content"] == "" and r["calls"][0]["name"] == "w"


def test_first_delta_names_the_call_then_the_arguments():
    p = OutputParser(tool_format="hermes", tools=TOOLS)
    events = p.push('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    deltas = [e for kind, e in events if kind == "tool_call"]
    assert (deltas[0].index, deltas[0].name, deltas[0].arguments) == (0, "get_weather", "")
    assert deltas[0].id.startswith("call_") and deltas[1].id is None
    assert json.loads(deltas[1].arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("text", [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "", "arguments": {}}</tool_call>',
    '<tool_call>["f"]</tool_call>',
    '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
    '<tool_call>{"name": "f", "argu',
])
def test_malformed_blocks_are_content_as_written(text):
    r = hermes(text)
    assert r["calls"] == [] and r["content"] == text


def test_unclosed_block_is_a_call_when_its_json_is_whole():
    r = hermes('<tool_call>{"name": "f", "arguments": {"a": 1}}')
    assert r["calls"] == [{"name": "f", "arguments": '{"a": 1}'}]


def test_an_xml_block_is_understood_by_the_hermes_parser():
    r = hermes("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    assert r["calls"] == [{"name": "get_weather", "arguments": '{"days": 3}'}]


def test_parse_hermes_block_shapes():
    assert parse_hermes_block('{"name": "f", "arguments": "{\\"x\\": 1}"}') == ("f", '{"x": 1}')
    assert parse_hermes_block('{"name": "f", "parameters": {"x": 1}}') == ("f", '{"x": 1}')
    assert parse_hermes_block('{"name": "f"}') == ("f", "{}")
    assert parse_hermes_block('{"name": "f", "arguments": "[1]"}') is None
    assert parse_hermes_block('{"name": "f", "arguments": "nope"}') is None


def test_forced_named_call_continues_the_arguments():
    r = hermes('{"city": "Kyiv"}}\n</tool_call>', forced=ForcedCall("get_weather"))
    assert r["calls"] == [{"name": "get_weather", "arguments": '{"city": "Kyiv"}'}]
    missing_brace = hermes('{"city": "Kyiv"}\n</tool_call>', forced=ForcedCall("get_weather"))
    assert missing_brace["calls"] == [{"name": "get_weather", "arguments": '{"city": "Kyiv"}'}]
    garbage = hermes("@@ ## not json", forced=ForcedCall("get_weather"))
    assert garbage["calls"] == [{"name": "get_weather", "arguments": "{}"}] and garbage["content"] == ""


def test_forced_any_call():
    r = hermes('{"name": "get_weather", "arguments": {"days": 1}}\n</tool_call>', forced=ForcedCall())
    assert r["calls"] == [{"name": "get_weather", "arguments": '{"days": 1}'}]
    r = hermes("no call here</tool_call> then text", forced=ForcedCall())
    assert r["calls"] == [] and r["content"] == "no call here</tool_call> then text"


def test_a_close_marker_inside_a_json_string_is_the_strings_text():
    # a held call's JSON string may hold "</tool_call>" (the grammar cannot keep it out); the block ended there
    # and the call came back as {} or as content
    args = {"city": 'a</tool_call> "quoted\\" </tool_call>', "days": 2}
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(args)}}}\n</tool_call>\nAfter.'
    r = hermes(text)
    assert [c["name"] for c in r["calls"]] == ["get_weather"] and json.loads(r["calls"][0]["arguments"]) == args
    assert r["content"] == "\nAfter."
    forced = every_split(f'{json.dumps(args)}}}\n</tool_call>',
                         tool_format="hermes", tools=TOOLS, forced=ForcedCall("get_weather"))
    assert json.loads(forced["calls"][0]["arguments"]) == args


def test_a_block_cut_off_after_a_call_is_dropped():
    """The output ends inside a second call's JSON (max_tokens): the first call stands, and the cut one
    is neither a call nor content (content a client sends back would render in front of the calls), unless
    it wrote one of the tools' names whole: then it is that call with {}, as an XML call stands once its
    name is out."""
    first = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    for cut in ('\n<tool_call>\n{"name": "get_wea', "\n<tool_call>"):
        r = hermes("On it." + first + cut)
        assert r["calls"] == [{"name": "get_time", "arguments": "{}"}] and r["content"] == "On it.", cut
    r = hermes("On it." + first + '\n<tool_call>\n{"name": "get_weather", "argu')
    assert r["calls"] == [{"name": "get_time", "arguments": "{}"}, {"name": "get_weather", "arguments": "{}"}]


@pytest.mark.parametrize("args", ['{"x": NaN}', '{"x": Infinity}', '{"x": -1e999}', '{"s": "x\\ud800y"}',
                                  '"{\\"x\\": NaN}"', '"{\\"s\\": \\"\\\\ud800\\"}"'])
def test_a_block_whose_json_a_response_cannot_carry_is_not_a_call(args):
    """NaN, Infinity, a number that overflows to one, a lone surrogate (in the object or in a string holding
    it): not JSON, so the block is content as written (a response could not carry such arguments)."""
    body = '{"name": "get_weather", "arguments": %s}' % args
    assert parse_hermes_block(body) is None
    r = hermes(f"<tool_call>\n{body}\n</tool_call>")
    assert r["calls"] == [] and body in r["content"]


@pytest.mark.parametrize("text,call", [
    ('<tool_call>\n{"name": "get_weather", "', "get_weather"),  # cut by max_tokens after the name: the call
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "get_weather"),
    ('<tool_call>\n{"name": "get_weat', None),  # the name is not whole: the text as written
    ('<tool_call>\n{"name": "launch", "', None),  # not one of the tools
])
def test_a_call_the_output_ended_inside_stands_once_its_name_is_whole(text, call):
    r = hermes(text)
    if call is None:
        assert r["calls"] == [] and r["content"] == text
    else:
        assert r["calls"] == [{"name": call, "arguments": "{}"}] and r["content"] == ""
    p = OutputParser(tool_format="hermes", tools=TOOLS)
    p.push(text)
    p.finish()
    assert p.cut_call == (0 if call else None)
