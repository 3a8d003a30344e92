"""A Messages body as the chat body it becomes, and the content blocks a turn's deltas make (no server)."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import ApiError
from ignis.gateway.messages_api import MessagesTurn
from ignis.gateway.messages_output import ContentBlocks
from ignis.gateway.tool_call_split import ToolCallDelta

BODY = {
    "model": "m", "max_tokens": 100, "temperature": 0.2, "top_k": 5, "stream": True, "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "Rule one.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Rule two."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                                                  "data": "QUJD"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                          {"type": "text", "text": "Calling."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                                          {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "one"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2",
                                      "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "!"}]},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "content": [
                                         {"type": "text", "text": "shot:"},
                                         {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
                                     {"type": "text", "text": "And now?"}]},
        {"role": "assistant", "content": "Plain."},
        {"role": "user", "content": "Bye"},
    ],
    "tools": [{"name": "f", "description": "F", "input_schema": {"type": "object", "properties": {"a": {}}}},
              {"name": "g", "input_schema": {"type": "object"}, "strict": True}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    "thinking": {"type": "disabled"},
    "stop_sequences": ["END"],
}


def test_a_full_body_becomes_its_chat_body():
    turn = MessagesTurn()
    chat = turn.translate(json.loads(json.dumps(BODY)))
    assert {k: chat[k] for k in ("model", "max_tokens", "temperature", "top_k", "stream")} == \
        {"model": "m", "max_tokens": 100, "temperature": 0.2, "top_k": 5, "stream": True}
    assert chat["stop"] == ["END"] and chat["tool_choice"] == "required" and not turn.parallel
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert chat["tools"][0] == {"type": "function", "function": {"name": "f", "description": "F",
                                                                 "parameters": BODY["tools"][0]["input_schema"]}}
    assert chat["tools"][1]["function"]["strict"] is True  # Anthropic's strict tool use: held as a strict tool
    m = chat["messages"]
    assert m[0] == {"role": "system", "content": "Rule one.\nRule two."}
    assert m[1] == {"role": "user", "content": [{"type": "text", "text": "Look:"}, {
        "type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}}]}
    assert m[2] == {"role": "assistant", "content": "Calling.", "reasoning_content": "hmm", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "toolu_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}
    assert m[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "one"}
    assert m[4] == {"role": "tool", "tool_call_id": "toolu_2", "content": "two\n!"}
    assert m[5] == {"role": "tool", "tool_call_id": "toolu_2", "content": [
        {"type": "text", "text": "shot:"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    assert m[6] == {"role": "user", "content": [{"type": "text", "text": "And now?"}]}
    assert m[7:] == [{"role": "assistant", "content": "Plain."}, {"role": "user", "content": "Bye"}]
    assert turn.origins == ["system", "messages[0]", "messages[1]", "messages[2].content[0]",
                            "messages[2].content[1]", "messages[2].content[2]", "messages[2]", "messages[3]",
                            "messages[4]"]
    err = turn.remap(ApiError(400, "messages[4].tool_call_id: unknown", param="messages[4].tool_call_id"))
    assert err.param == "messages[2].content[1].tool_use_id" and err.message.startswith("messages[2].content[1]")


@pytest.mark.parametrize("choice, want", [({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
                                          ({"type": "tool", "name": "f"},
                                           {"type": "function", "function": {"name": "f"}})])
def test_tool_choices(choice, want):
    chat = MessagesTurn().translate({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                                     "tool_choice": choice})
    assert chat["tool_choice"] == want


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 1, "messages": []}, "messages"),
    ({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"max_tokens": 1, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": []}]}]},
     "messages[0].content[0].input"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]},
     "system[0].type"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "mcp_servers": [{}]}, "mcp_servers"),
])
def test_bad_bodies_name_the_field(body, param):
    with pytest.raises(ApiError) as e:
        MessagesTurn().translate(body)
    assert e.value.param == param


def test_deltas_make_blocks_and_events_and_parallel_false_keeps_the_first_call():
    blocks = ContentBlocks(parallel_calls=False)
    events = blocks.feed(ChoiceDelta(0, reasoning="think", content="Hi"))
    events += blocks.feed(ChoiceDelta(0, tool_calls=[ToolCallDelta(0, "call_1", "f", '{"a"'),
                                                     ToolCallDelta(0, None, None, ": 1}"),
                                                     ToolCallDelta(1, "call_2", "g", "{}")]))
    events += blocks.feed(ChoiceDelta(0, finish_reason="tool_calls"))
    assert blocks.blocks == [{"type": "thinking", "thinking": "think", "signature": ""},
                             {"type": "text", "text": "Hi"},
                             {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]
    assert [e["type"] for e in events] == ["content_block_start", "content_block_delta", "content_block_stop",
                                           "content_block_start", "content_block_delta", "content_block_stop",
                                           "content_block_start", "content_block_delta", "content_block_delta",
                                           "content_block_stop"]
    assert events[7]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    assert events[6]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert blocks.stop_reason == "tool_use"
    stopped = ContentBlocks()
    stopped.feed(ChoiceDelta(0, content="x", finish_reason="stop", stop_sequence="END"))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")


def test_tools_keep_openais_key_order_so_both_apis_render_one_prompt():
    chat = MessagesTurn().translate({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [
        {"input_schema": {"type": "object"}, "description": "d", "name": "f"}]})
    assert list(chat["tools"][0]["function"]) == ["name", "description", "parameters"]


@pytest.mark.parametrize("content, want", [
    ("file not found", "Error: file not found"),
    ([{"type": "text", "text": "exit 1"}, {"type": "text", "text": "boom"}], "Error: exit 1\nboom"),
    ("Error: already said", "Error: already said"),  # the tool's own words are not marked twice
    ("<tool_use_error>no such file</tool_use_error>", "Error: <tool_use_error>no such file</tool_use_error>"),
    (None, "Error:"),
    ([{"type": "text", "text": "shot:"}, {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}],
     [{"type": "text", "text": "Error:"}, {"type": "text", "text": "shot:"},
      {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]),
])
def test_a_failed_tool_result_is_marked_as_an_error(content, want):
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True}
    if content is not None:
        block["content"] = content
    body = {"max_tokens": 4, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [block]}]}
    tool = MessagesTurn().translate(body)["messages"][-1]
    assert tool["role"] == "tool" and tool["content"] == want
    plain = MessagesTurn().translate(dict(body, messages=body["messages"][:2] + [
        {"role": "user", "content": [dict(block, is_error=False)]}]))["messages"][-1]["content"]
    assert "Error:" not in json.dumps(plain) or "Error:" in json.dumps(content)  # unflagged: as given


@pytest.mark.parametrize("empty", ["", [], [{"type": "text", "text": ""}]])
def test_an_empty_final_assistant_turn_is_no_prefill(empty):
    """Anthropic: "all messages must have non-empty content except for the optional final assistant
    message": an empty one is dropped, and the answer is a new turn (no continue_final_message)."""
    chat = MessagesTurn().translate({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"},
                                                                   {"role": "assistant", "content": empty}]})
    assert chat["messages"] == [{"role": "user", "content": "Hi"}] and "continue_final_message" not in chat


def test_consecutive_turns_of_one_role_are_combined_as_anthropic_combines_them():
    turn = MessagesTurn()
    chat = turn.translate({"max_tokens": 5, "messages": [
        {"role": "user", "content": "A"}, {"role": "user", "content": [{"type": "text", "text": "B"}]},
        {"role": "assistant", "content": "X"},
        {"role": "assistant", "content": [{"type": "text", "text": "Y"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
        {"role": "user", "content": "Next?"}]})
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "user"]
    assert chat["messages"][0]["content"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    assert chat["messages"][1]["content"] == "XY" and chat["messages"][1]["tool_calls"][0]["id"] == "toolu_1"
    assert turn.origins == ["messages[0]", "messages[2]", "messages[4].content[0]", "messages[5]"]
    # an error in a combined turn's call names its tool_use block
    err = turn.remap(ApiError(400, "is required", param="messages[1].tool_calls[0].function.name"))
    assert err.param == "messages[3].content[1].name"


def test_an_error_in_a_tool_use_block_names_the_block():
    turn = MessagesTurn()
    turn.translate({"max_tokens": 5, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Calling."},
                                          {"type": "tool_use", "id": "t1", "name": "", "input": {}}]}]})
    err = turn.remap(ApiError(400, "is required", param="messages[1].tool_calls[0].function.name"))
    assert err.param == "messages[1].content[1].name"


def test_a_format_with_callable_tools_is_noted_for_the_done_line():
    fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    turn = MessagesTurn()
    chat = turn.translate({"max_tokens": 9, "messages": [{"role": "user", "content": "Hi"}], "output_config": fmt,
                           "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
    assert "response_format" not in chat and turn.notes == ["output_config.format not enforced (callable tools)"]
    turn = MessagesTurn()
    chat = turn.translate({"max_tokens": 9, "messages": [{"role": "user", "content": "Hi"}], "output_config": fmt})
    assert "response_format" in chat and turn.notes == []
