"""The Responses API's pure parts: reasoning blobs (seal, open, tamper), the stored-response bounds and TTL,
and the item and tool translation (no server)."""

from __future__ import annotations

import os
import stat

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.reasoning_seal import ReasoningSeal, SealError, load_key
from ignis.gateway.responses_items import Conversation, translate_input
from ignis.gateway.responses_store import ResponseStore
from ignis.gateway.responses_tools import ToolNames, translate_tool_choice, translate_tools


def test_a_blob_opens_to_its_text_and_nothing_else_opens():
    seal = ReasoningSeal(key=b"k" * 32)
    text = "Plan: read the file, then patch it. " * 20 + "ünïcödé"
    blob = seal.seal(text)
    assert seal.open(blob) == text and text[:10] not in blob
    assert seal.seal(text) != blob  # a fresh nonce each time
    body = blob[len("ig1."):]
    flipped = body[:30] + ("A" if body[30] != "A" else "B") + body[31:]
    for bad in ("ig1." + flipped, blob[:-8], "ig1.", "nope", "ig1.!!!", ReasoningSeal(key=b"x" * 32).seal(text)):
        with pytest.raises(SealError):
            seal.open(bad)


def test_the_install_key_file_is_created_private_and_reused(tmp_path):
    path = tmp_path / "default-reasoning.key"
    blob = ReasoningSeal(path).seal("kept across restarts")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert ReasoningSeal(path).open(blob) == "kept across restarts"
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="0600"):
        load_key(path)
    fallback = ReasoningSeal(path)  # an unusable file: a key of this process only
    assert fallback.open(fallback.seal("x")) == "x"
    with pytest.raises(SealError):
        fallback.open(blob)


def test_store_bounds_entries_characters_and_age():
    now = [0.0]
    store = ResponseStore(max_entries=2, max_chars=130, ttl_s=10, clock=lambda: now[0])
    # an entry counts its messages' text (role included) and its response object's JSON ({"id":"a"}: 10)
    store.put("a", [{"role": "user", "content": "x" * 40}], {"id": "a"})  # 54
    store.put("b", [{"role": "user", "content": "y" * 40}], {"id": "b"})  # 54
    store.put("c", [{"role": "user", "content": "z" * 10}], {"id": "c"})  # 24
    assert store.get("a") is None and store.get("b") and store.get("c") and len(store) == 2
    store.put("d", [{"role": "user", "content": "w" * 60}], {"id": "d"})  # 54 + 24 + 74 > 130: b goes
    assert store.get("b") is None and store.get("c") and store.get("d")
    store.put("huge", [{"role": "user", "content": "h" * 131}], {"id": "huge"})
    assert store.get("huge") is None and store.get("d")
    now[0] = 11
    assert store.get("c") is None and store.get("d") is None and len(store) == 0
    assert not store.delete("d")


def test_instructions_tools_and_metadata_count_against_the_store():
    """The response object echoes what the messages never hold (``instructions`` are not carried over): a
    client sending long instructions cannot grow the store past its bound."""
    store = ResponseStore(max_entries=100, max_chars=10_000)
    for i in range(10):
        store.put(f"r{i}", [{"role": "user", "content": "hi"}], {"id": f"r{i}", "instructions": "i" * 3000})
    assert store.get("r9") and store.get("r6") is None and len(store) == 3


def test_reasoning_cut_before_any_answer_stays_a_turn_as_previous_response_id_keeps_it():
    # resent with store false, an output that was only reasoning vanished: two user turns in a row, where
    # previous_response_id renders the empty assistant turn between them
    body = {"input": [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking, cut"}]},
        {"role": "user", "content": "go on"}]}
    conv = translate_input(Fields(body), ToolNames(), ReasoningSeal(key=b"k" * 32), Conversation())
    assert conv.messages == [{"role": "user", "content": "go"},
                             {"role": "assistant", "content": "", "reasoning_content": "thinking, cut"},
                             {"role": "user", "content": "go on"}]


def test_items_become_one_assistant_turn_with_reasoning_and_calls():
    seal = ReasoningSeal(key=b"k" * 32)
    names = ToolNames()
    body = {"input": [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "visible"}],
         "encrypted_content": seal.seal("hidden plan")},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "namespace": "crm", "arguments": "{\"a\": 1}"},
        {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "one"}]},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "dangling"}]}]}
    conv = translate_input(Fields(body), names, seal, Conversation())
    assert conv.messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "hidden plan", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "crm__lookup", "arguments": "{\"a\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    assert conv.origins == ["input[0]", "input[2]", "input[5]", "input[6]"]


def test_tools_flattened_hosted_ignored_and_choices_mapped():
    ignored = []
    body = {"tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": True},
                      {"type": "namespace", "name": "crm", "description": "d", "tools": [
                          {"type": "function", "name": "lookup"}, {"type": "custom", "name": "free"}]},
                      {"type": "web_search"}, {"type": "mcp", "server_label": "x"}],
            "tool_choice": {"type": "function", "name": "lookup", "namespace": "crm"}}
    tools, names = translate_tools(Fields(body), ignored.append)
    assert [t["function"]["name"] for t in tools] == ["shell", "crm__lookup"]
    assert tools[0]["function"]["strict"] is True and tools[1]["function"]["parameters"]["type"] == "object"
    assert ignored == ["namespace:custom", "web_search", "mcp"]
    assert names.client_name("crm__lookup") == ("crm", "lookup") and names.client_name("shell") == (None, "shell")
    assert names.origins == ["tools[0]", "tools[1].tools[0]"]
    assert translate_tool_choice(Fields(body), names) == {"type": "function", "function": {"name": "crm__lookup"}}
    assert translate_tool_choice(Fields({"tool_choice": {"type": "web_search"}}), names) == "auto"
    allowed = {"type": "allowed_tools", "mode": "required",
               "tools": [{"type": "function", "name": "lookup", "namespace": "crm"}, {"type": "web_search"}]}
    assert translate_tool_choice(Fields({"tool_choice": allowed}), names) == {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "crm__lookup"}}]}}
    hosted_only = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "web_search"}]}
    assert translate_tool_choice(Fields({"tool_choice": hosted_only}), names) == "auto"
    with pytest.raises(ApiError) as e:
        translate_tool_choice(Fields({"tool_choice": dict(allowed, tools=[{"type": "function", "name": "nope"}])}),
                              names)
    assert e.value.param == "tool_choice.tools[0].name"
    with pytest.raises(ApiError) as e:
        translate_tools(Fields({"tools": [{"type": "function", "name": "a b"}]}), ignored.append)
    assert e.value.param == "tools[0].name"


def test_a_cut_closes_the_open_item_as_far_as_it_was_written():
    from ignis.gateway.choice import ChoiceDelta
    from ignis.gateway.tool_call_split import ToolCallDelta
    from ignis.gateway.responses_output import OutputItems

    items = OutputItems(ToolNames())
    items.feed(ChoiceDelta(0, reasoning="Think."))
    items.feed(ChoiceDelta(0, content="Partial ans"))
    done = items.cut()
    assert [e["type"] for e in done][-1] == "response.output_item.done"
    reasoning, message = items.items
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Think."}]
    assert message["status"] == "incomplete" and message["content"][0]["text"] == "Partial ans"
    assert items.cut() == []  # nothing open
    for args, status in (('{"city": "Os', "incomplete"), ('{"city": "Oslo"}', "completed")):
        calls = OutputItems(ToolNames())
        calls.feed(ChoiceDelta(0, tool_calls=[ToolCallDelta(0, id="c1", name="get_weather", arguments=args)]))
        calls.cut()
        assert calls.items[0]["status"] == status and calls.items[0]["arguments"] == args


def test_input_items_are_listed_as_openai_lists_them():
    from ignis.gateway.responses_items import listed_items

    assert [(i["type"], i["role"], i["content"]) for i in listed_items("Hi", set())] == \
        [("message", "user", [{"type": "input_text", "text": "Hi"}])]
    given = [
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]},
        {"type": "message", "role": "assistant", "id": "msg_given", "content": "Sure."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "ig1.x"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "namespace": "crm", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    items = listed_items(given, set())
    assert items[0]["content"][1] == {"type": "input_image", "image_url": "data:image/png;base64,AA==",
                                      "detail": "auto"}
    assert items[1] == {"id": "msg_given", "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]}
    assert items[2]["id"].startswith("rs_") and items[2]["encrypted_content"] == "ig1.x"
    assert items[3]["arguments"] == "{}" and items[3]["namespace"] == "crm" and items[3]["status"] == "completed"
    assert items[4]["id"].startswith("fco_")
    # an id given twice, or one of the previous_response_id chain's items sent again: OpenAI's 400
    from ignis.gateway.errors import ApiError

    for earlier, items in ((set(), given[:4] + [dict(given[4], id="msg_given")]), ({"msg_given"}, given[1:2])):
        with pytest.raises(ApiError) as e:
            listed_items(items, earlier)
        assert e.value.status == 400 and "Duplicate item found with id msg_given" in e.value.message
        assert e.value.param == f"input[{len(items) - 1}].id"
