"""Choosing the tool-call format, the prompt suffix that forces a call, the flag, and tool-result checks."""

from __future__ import annotations

import argparse

import pytest

from ignis.gateway.config import GatewayConfig
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import check_tool_results, parse_messages
from ignis.gateway.tool_call_format import forced_call_suffix, resolve_format
from ignis.launcher import serve
from tests.support.real_tokenizer import TEMPLATE_FILES


def test_auto_follows_the_template():
    assert resolve_format("auto", "... <function=example_function_name> ...") == "qwen3_xml"
    assert resolve_format("auto", '{"name": <function-name>, "arguments": <args-json-object>}') == "hermes"
    assert resolve_format("hermes", "<function=x>") == "hermes"
    assert resolve_format("qwen3_xml", "") == "qwen3_xml"
    with pytest.raises(ValueError, match="--tool-call-parser"):
        resolve_format("mistral", "")


def test_auto_on_the_families_templates():
    xml_template = TEMPLATE_FILES["qwen3_5"]
    if xml_template.is_file():
        assert resolve_format("auto", xml_template.read_text()) == "qwen3_xml"
    assert resolve_format("auto", TEMPLATE_FILES["qwen3_next"].read_text()) == "hermes"


def test_forced_suffixes():
    assert forced_call_suffix("qwen3_xml", "f", False) == "<tool_call>\n<function=f>\n"
    assert forced_call_suffix("hermes", "f", False) == '<tool_call>\n{"name": "f", "arguments":'
    assert forced_call_suffix("qwen3_xml", None, False) == forced_call_suffix("hermes", None, False) == "<tool_call>\n"
    assert forced_call_suffix("qwen3_xml", "f", True) == "\n</think>\n\n<tool_call>\n<function=f>\n"


def test_flag_is_checked_and_reaches_the_gateway_through_serve():
    assert GatewayConfig().tool_call_parser == "auto"
    with pytest.raises(ValueError, match="--tool-call-parser"):
        GatewayConfig(tool_call_parser="xml")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--tool-call-parser", "hermes"])
    assert serve.child_argv(GatewayConfig, args, serve._SKIP[GatewayConfig]) == ["--tool-call-parser", "hermes"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-call-parser", "nope"])


def messages(*raw):
    return parse_messages(Fields({"messages": [{"role": "user", "content": "q"}, *raw]}))


def call(call_id=None):
    c = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    return c if call_id is None else dict(c, id=call_id)


def test_tool_results_must_answer_an_earlier_call():
    check_tool_results(messages({"role": "assistant", "tool_calls": [call("a"), call("b")]},
                                {"role": "tool", "tool_call_id": "b", "content": "1"},
                                {"role": "tool", "tool_call_id": "a", "content": "2"}))
    check_tool_results(messages({"role": "assistant", "tool_calls": [call()]},
                                {"role": "tool", "tool_call_id": "anything", "content": "1"}))
    with pytest.raises(ApiError) as e:
        check_tool_results(messages({"role": "tool", "content": "1"}))
    assert e.value.status == 400 and e.value.param == "messages[1]"
    with pytest.raises(ApiError) as e:
        check_tool_results(messages({"role": "assistant", "tool_calls": [call("a")]},
                                    {"role": "tool", "tool_call_id": "z", "content": "1"}))
    assert e.value.param == "messages[2].tool_call_id"


@pytest.mark.parametrize("arguments,words", [(7, "must be a string"), (None, "got null"),
                                             ("[1, 2]", "JSON object"), ("{x", "not valid JSON")])
def test_assistant_call_arguments_must_be_json_object_strings_or_objects(arguments, words):
    bad = {"type": "function", "function": {"name": "f", "arguments": arguments}}
    with pytest.raises(ApiError) as e:
        messages({"role": "assistant", "tool_calls": [bad]})
    assert e.value.param == "messages[1].tool_calls[0].function.arguments" and words in e.value.message


def test_assistant_call_arguments_may_be_an_object_as_vllm_takes_them():
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert messages({"role": "assistant", "tool_calls": [call]})[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
