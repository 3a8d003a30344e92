"""/v1/responses on `ignis serve` with the demo model (real gateway and engine), through the openai client.

The demo model's weights are random, so its text is arbitrary: a function
call is made certain by a named ``tool_choice`` (the call's grammar holds it),
and checks are on shapes, events, usage and prompt reuse. A Codex-like request
body (developer messages, eight function tools, a namespace tool, web_search,
store false, the reasoning blob included, a prompt_cache_key) replayed twice
reads its prefix back the second time.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.conftest import API_KEY, http, stop_serve
from tests.gateway.hardening_support import wait_until
from tests.gateway.responses_support import check_events, check_response, collapsed, item_events, raw_events
from tests.gateway.test_reuse_http import make_server, text



def function(name: str, seed: int) -> dict:
    return {"type": "function", "name": name, "description": text(60, seed), "strict": False,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": text(20, seed + 1)},
                "limit": {"type": "integer", "description": text(10, seed + 2)}}, "required": ["path"]}}


TOOLS = [function(n, 300 + i) for i, n in enumerate(
    ("shell", "read_file", "list_dir", "grep_files", "apply_patch", "update_plan", "view_image", "write_stdin"))]
OPEN_FILE = {"type": "function", "name": "open_file", "description": "Open a file", "parameters": {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"enum": ["README.md", "setup.py"]}}}}
"""Finite arguments: a forced call of it from random weights always finishes."""
NAMESPACE = {"type": "namespace", "name": "mcp_docs", "description": "Documentation server",
             "tools": [function("search_docs", 400), function("fetch_page", 410)]}
CODEX_BODY = {
    "instructions": None,
    "input": [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "You are a coding agent running in a terminal. " + text(400, 11)}]},
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "## Skills\n" + text(150, 12)}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/work/app</cwd>\n  <shell>bash</shell>\n"
                                           "</environment_context>"},
            {"type": "input_text", "text": "Fix the failing test in tests/test_io.py."}]}],
    "tools": [*TOOLS, NAMESPACE, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-7f3a", "stream": True,
    "client_metadata": {"x-codex-turn": "1"}, "max_output_tokens": 8, "temperature": 0,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s, client = make_server(tmp_path_factory)
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


def test_plain_text_turn_not_streamed_and_streamed(served):
    server, client = served
    r = client.responses.create(model=server.model, input="Tell me about the weather.", max_output_tokens=6,
                                temperature=0, instructions="Be brief.")
    raw = http("GET", server.url + f"/v1/responses/{r.id}", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    check_response(raw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    events = raw_events(server.url, {"model": server.model, "input": "Tell me about the weather.",
                                     "max_output_tokens": 6, "temperature": 0, "instructions": "Be brief."},
                        api_key=API_KEY)
    check_events(events)
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.incomplete"
    assert "".join(c["text"] for i in final["output"] if i["type"] == "message" for c in i["content"]) == \
        r.output_text
    streamed = list(client.responses.create(model=server.model, input="Tell me about the weather.", stream=True,
                                            max_output_tokens=6, temperature=0, instructions="Be brief."))
    assert collapsed([e.type for e in streamed]) == collapsed([t for t, _ in events])
    assert streamed[-1].response.output_text == r.output_text


def test_a_background_response_is_the_foreground_one(served):
    """The model's greedy answer is the same generated in the background; its events replay as streamed."""
    server, client = served
    body = dict(model=server.model, input="Tell me about the weather.", max_output_tokens=6, temperature=0,
                instructions="Be brief.")
    fg = client.responses.create(**body)
    bg = client.responses.create(**body, background=True)
    assert bg.background is True and bg.status in ("queued", "in_progress")
    wait_until(lambda: client.responses.retrieve(bg.id).status not in ("queued", "in_progress"), 60,
               "the background response did not end")
    done = client.responses.retrieve(bg.id)
    assert done.status == fg.status == "incomplete" and done.output_text == fg.output_text
    assert done.usage.output_tokens == fg.usage.output_tokens == 6
    replayed = list(client.responses.retrieve(bg.id, stream=True))
    assert [e.type for e in replayed][:3] == ["response.created", "response.queued", "response.in_progress"]
    assert replayed[-1].type == "response.incomplete" and replayed[-1].response.output_text == fg.output_text
    streamed = list(client.responses.create(**body, stream=True))
    assert collapsed([e.type for e in replayed[3:]]) == collapsed([e.type for e in streamed[2:]])


def test_output_text_logprobs_are_the_chat_paths(served):
    """``include: ["message.output_text.logprobs"]`` and ``top_logprobs``: the answer's tokens with their
    logprobs and alternatives, as chat completions gives them for the same conversation."""
    server, client = served
    body = dict(model=server.model, input="Tell me about the weather.", max_output_tokens=6, temperature=0,
                instructions="Be brief.", include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**body)
    [message] = [i for i in r.output if i.type == "message"]
    lps = message.content[0].logprobs
    chat = client.chat.completions.create(model=server.model, max_tokens=6, temperature=0, logprobs=True,
                                          top_logprobs=2, messages=[{"role": "system", "content": "Be brief."},
                                                                    {"role": "user",
                                                                     "content": "Tell me about the weather."}])
    expected = chat.choices[0].logprobs.content
    assert [e.token for e in lps] == [e.token for e in expected] and len(lps) == 6
    assert "".join(e.token for e in lps) == r.output_text
    for got, want in zip(lps, expected):
        assert abs(got.logprob - want.logprob) < 1e-4 and got.bytes == want.bytes
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
        assert len(got.top_logprobs) == 2
    assert r.top_logprobs == 2
    events = raw_events(server.url, body, api_key=API_KEY)
    check_events(events)
    deltas = [lp for t, e in events if t == "response.output_text.delta" for lp in e["logprobs"]]
    [done] = [e for t, e in events if t == "response.output_text.done"]
    assert [d["token"] for d in deltas] == [d["token"] for d in done["logprobs"]] == [e.token for e in lps]
    plain = client.responses.create(**{k: v for k, v in body.items() if k not in ("include", "top_logprobs")})
    assert plain.output_text == r.output_text
    assert [i for i in plain.output if i.type == "message"][0].content[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**dict(body, top_logprobs=21))
    assert e.value.body["param"] == "top_logprobs"


def test_multi_turn_with_a_function_call_and_its_output(served):
    server, client = served
    tools = [OPEN_FILE, TOOLS[0]]
    first = client.responses.create(model=server.model, input="Read the README.", tools=tools, temperature=0,
                                    tool_choice={"type": "function", "name": "open_file"}, max_output_tokens=64)
    [call] = [i for i in first.output if i.type == "function_call"]
    assert call.name == "open_file" and json.loads(call.arguments)["name"] in ("README.md", "setup.py")
    history = [{"role": "user", "content": "Read the README."}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "# App\nA tool."}]
    second = client.responses.create(model=server.model, input=history, tools=tools, temperature=0,
                                     max_output_tokens=4)
    assert second.usage.input_tokens > first.usage.input_tokens
    third = client.responses.create(model=server.model, previous_response_id=first.id, tools=tools, temperature=0,
                                    max_output_tokens=4, input=history[2:])
    assert third.usage.input_tokens == second.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens > 0


def test_codex_like_body_replayed_reuses_its_prefix(served):
    server, _ = served
    before = http("GET", server.url + "/metrics").body.decode()
    runs = []
    for _ in range(2):
        events = raw_events(server.url, dict(CODEX_BODY, model=server.model), api_key=API_KEY)
        check_events(events)
        runs.append(events[-1][1]["response"])
    first, second = (r["usage"] for r in runs)
    assert first["input_tokens"] == second["input_tokens"] > 1500
    assert second["input_tokens_details"]["cached_tokens"] >= 0.9 * second["input_tokens"], (first, second)
    assert all(i["type"] != "web_search_call" for r in runs for i in r["output"])
    assert 'tool="web_search"' in http("GET", server.url + "/metrics").body.decode() and \
        'tool="web_search"' not in before
    assert item_events(events)[0] == "response.output_item.added"


def test_tampered_reasoning_blob_and_bad_items_are_400(served):
    server, client = served
    items = [{"role": "user", "content": "hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "ig1.AAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                                                                                    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
             {"role": "user", "content": "again"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model, input=items, max_output_tokens=2)
    assert e.value.body["param"] == "input[1].encrypted_content"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model, input=[{"type": "item_reference", "id": "msg_1"}])
    assert e.value.body["param"] == "input[0].type"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=server.model, input="x", previous_response_id="resp_missing")
    ok = client.responses.create(model=server.model, input="still serving?", max_output_tokens=2)
    assert ok.status == "incomplete"


def test_openapi_document_lists_the_route(served):
    server, _ = served
    doc = http("GET", server.url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "post" in doc["paths"]["/v1/responses"]
