"""GET /v1/responses/{id}/input_items and cancelled background responses, over HTTP under the official Qwen3.5
template, in front of a scripted engine (``fake_engine``), with OpenAI's client.

The engine answers each request with a scripted text (``gw.say``), or, for a seed from ``hold``, sends a
scripted text's tokens and then holds the request until it is aborted: a background run caught mid-answer.
"""

from __future__ import annotations

import itertools
import json

import openai
import pytest
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from ignis.shared.wire import StreamTokens, TokenBatch
from tests.gateway.conftest import http
from tests.gateway.hardening_support import wait_until
from tests.gateway.responses_support import check_response
from tests.gateway.test_responses_background_http import sse_events
from tests.gateway.test_tools_http_qwen3_5 import xml_call
from tests.gateway.tools_http_support import tools_gateway

ITEM = TypeAdapter(ResponseItem)
_HOLD_SEEDS = itertools.count(50_000)
THINK = {"effort": "high", "summary": "auto"}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    for g in tools_gateway(tmp_path_factory, "qwen3_5"):
        engine, original = g.engine, g.engine._answer
        g.holds = {}

        def answer(msg, peer):  # a held seed: its tokens, then nothing until an Abort
            ids = g.holds.get(msg.sampling.seed)
            if ids is None:
                return original(msg, peer)
            for token in ids:
                engine.channel.send(TokenBatch((StreamTokens(msg.id, (token,)),)), peer)
            engine._held[msg.id] = (peer, len(msg.prompt_ids))

        engine._answer = answer
        yield g


@pytest.fixture(scope="module")
def client(gw):
    with gw.client() as c:
        yield c


def hold(gw, text: str) -> int:
    """A seed the engine answers with ``text``'s tokens and then holds until aborted."""
    seed = next(_HOLD_SEEDS)
    gw.holds[seed] = gw.tokenizer.encode(text)
    return seed


def listing(gw, rid: str, query: str = "") -> tuple[int, dict]:
    r = http("GET", f"{gw.url}/v1/responses/{rid}/input_items{query}")
    return r.status, json.loads(r.body)


def all_items(gw, rid: str) -> list[dict]:
    """Every listed input item, oldest first, each checked against the openai package's item models."""
    status, page = listing(gw, rid, "?order=asc&limit=100")
    assert status == 200 and page["object"] == "list" and page["has_more"] is False, page
    for item in page["data"]:
        ITEM.validate_python(item, strict=True)
    return page["data"]


# ----- input items --------------------------------------------------------------------------------------

def test_input_items_of_a_stored_response_through_the_sdk(gw, client):
    r = client.responses.create(model=gw.model, instructions="Be brief.", extra_body={"seed": gw.say("Sunny.")},
                                input=[{"role": "developer", "content": "Answer in English."},
                                       {"type": "message", "role": "user", "id": "msg_mine",
                                        "content": [{"type": "input_text", "text": "Weather in "},
                                                    {"type": "input_text", "text": "Paris?"}]}])
    page = client.responses.input_items.list(r.id)  # newest first by default
    assert [i.role for i in page.data] == ["user", "developer"] and page.has_more is False
    user, dev = page.data
    assert user.id == "msg_mine" and [c.text for c in user.content] == ["Weather in ", "Paris?"]
    assert dev.id.startswith("msg_") and dev.content[0].type == "input_text" and dev.status == "completed"
    assert dev.content[0].text == "Answer in English."  # the instructions are no input item
    status, raw = listing(gw, r.id)
    assert status == 200 and raw["first_id"] == "msg_mine" and raw["last_id"] == dev.id
    assert [i["id"] for i in all_items(gw, r.id)] == [dev.id, "msg_mine"]


def test_a_continued_conversation_lists_every_earlier_item_and_pages(gw, client):
    first = client.responses.create(model=gw.model, input="Weather in Paris?", tools=[WEATHER], reasoning=THINK,
                                    include=["reasoning.encrypted_content"],
                                    extra_body={"seed": gw.say("Look it up.\n</think>\n\n"
                                                               + xml_call("get_weather", city="Paris"))})
    assert [i.type for i in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    second = client.responses.create(
        model=gw.model, previous_response_id=first.id, tools=[WEATHER], extra_body={"seed": gw.say("Sunny.")},
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}])
    third = client.responses.create(model=gw.model, previous_response_id=second.id, input="And tomorrow?",
                                    extra_body={"seed": gw.say("Rain.")})
    items = all_items(gw, third.id)
    assert [i["type"] for i in items] == ["message", "reasoning", "function_call", "function_call_output",
                                          "message", "message"]
    assert items[0]["content"] == [{"type": "input_text", "text": "Weather in Paris?"}]
    assert [i["id"] for i in items[1:3]] == [first.output[0].id, call.id]  # the earlier output, same ids
    assert items[2]["call_id"] == call.call_id and items[3]["call_id"] == call.call_id
    assert items[4]["id"] == second.output[0].id and items[4]["role"] == "assistant"
    assert items[4]["content"][0]["text"] == "Sunny."
    assert items[5]["role"] == "user" and items[5]["content"][0]["text"] == "And tomorrow?"
    assert "encrypted_content" not in items[1]  # only when asked for
    ids = [i["id"] for i in items]
    assert len(set(ids)) == len(ids)
    blob = client.responses.input_items.list(third.id, order="asc", include=["reasoning.encrypted_content"])
    assert blob.data[1].encrypted_content == first.output[0].encrypted_content
    # the earlier responses list their own part of it
    assert [i["id"] for i in all_items(gw, second.id)] == ids[:4]
    # pages: limit, order, after, has_more; the SDK follows has_more with after
    page = client.responses.input_items.list(third.id, limit=2, order="asc")
    assert [i.id for i in page.data] == ids[:2] and page.has_more is True
    page = client.responses.input_items.list(third.id, limit=4, order="asc", after=ids[1])
    assert [i.id for i in page.data] == ids[2:6] and page.has_more is False
    page = client.responses.input_items.list(third.id, limit=2)
    assert [i.id for i in page.data] == ids[::-1][:2] and page.has_more is True
    assert [i.id for i in client.responses.input_items.list(third.id, limit=1)] == ids[::-1]
    assert [i.id for i in client.responses.input_items.list(third.id, limit=4, order="asc")] == ids
    status, raw = listing(gw, third.id, f"?order=asc&before={ids[4]}&limit=2")
    assert status == 200 and [i["id"] for i in raw["data"]] == ids[2:4]


def test_unknown_unstored_and_deleted_responses_are_404_and_bad_parameters_400(gw, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.input_items.list("resp_unknown")
    assert e.value.body["code"] == "response_not_found"
    unstored = client.responses.create(model=gw.model, input="Hi", store=False, extra_body={"seed": gw.say("Hi.")})
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(unstored.id)
    kept = client.responses.create(model=gw.model, input="Hi", extra_body={"seed": gw.say("Hi.")})
    for query, param in (("?limit=0", "limit"), ("?limit=101", "limit"), ("?limit=x", "limit"),
                         ("?order=sideways", "order"), ("?after=msg_nope", "after"), ("?before=msg_nope", "before")):
        status, body = listing(gw, kept.id, query)
        assert status == 400 and body["error"]["param"] == param and body["error"]["type"] == \
            "invalid_request_error", (query, body)
    assert listing(gw, kept.id, "?limit=100&include=file_search_call.results")[0] == 200  # accepted
    client.responses.delete(kept.id)
    status, body = listing(gw, kept.id)
    assert status == 404 and body["error"]["code"] == "response_not_found"
    doc = http("GET", gw.url + "/openapi.json").json()
    listed = doc["paths"]["/v1/responses/{response_id}/input_items"]["get"]
    assert listed["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["object"] == \
        {"const": "list"}


def test_a_background_response_lists_its_input_while_running(gw, client):
    r = client.responses.create(model=gw.model, input="Plan it.", background=True,
                                extra_body={"seed": hold(gw, "Step one")})
    items = all_items(gw, r.id)
    assert [i["content"][0]["text"] for i in items] == ["Plan it."]
    client.responses.cancel(r.id)
    assert [i["id"] for i in all_items(gw, r.id)] == [items[0]["id"]]


# ----- cancelling keeps what was generated ------------------------------------------------------------------

def test_a_cancelled_response_keeps_its_partial_output_and_usage(gw, client):
    text = "Weigh the options.\n</think>\n\nThe plan: first migrate"
    r = client.responses.create(model=gw.model, input="Plan the migration.", background=True, reasoning=THINK,
                                stream=False, extra_body={"seed": hold(gw, text)})
    prompt_ids = wait_until(lambda: [g.prompt_ids for g in gw.engine.generates if g.id.startswith(r.id)], 10,
                            "the engine got no request")[0]

    def written() -> bool:
        now = client.responses.retrieve(r.id)
        return now.status == "in_progress" and [i.type for i in now.output] == ["reasoning", "message"]

    wait_until(written, 10, "the run did not write its message")
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    got = client.responses.retrieve(r.id)
    check_response(got.model_dump(mode="json", exclude_unset=True))
    assert got.model_dump() == cancelled.model_dump()
    reasoning, message = got.output
    # what a run of the same text to its end gives
    whole = client.responses.create(model=gw.model, input="Plan the migration.", reasoning=THINK,
                                    extra_body={"seed": gw.say(text)})
    assert reasoning.summary[0].text == whole.output[0].summary[0].text and "options" in reasoning.summary[0].text
    assert message.status == "incomplete" and got.output_text == whole.output_text == "The plan: first migrate"
    assert got.usage is not None and got.usage.output_tokens == len(gw.tokenizer.encode(text))
    assert got.usage.input_tokens == len(prompt_ids)
    assert got.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens
    assert 0 < got.usage.output_tokens_details.reasoning_tokens < got.usage.output_tokens
    # its events end as GET does: the cut item's done events carry the same text and status, then the stream ends
    events = sse_events(http("GET", f"{gw.url}/v1/responses/{r.id}?stream=true").body)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == got.model_dump(mode="json", exclude_unset=True)["output"]
    texts = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert texts == ["The plan: first migrate"]
    assert not any(e["type"] in ("response.completed", "response.incomplete", "response.failed") for e in events)


def test_a_cancelled_streamed_run_keeps_text_held_back_and_a_whole_call(gw, client):
    # "Done <" may open a tag: the parser holds it back until it knows; the cancel keeps it as text
    r = client.responses.create(model=gw.model, input="Go.", background=True,
                                extra_body={"seed": hold(gw, "Done <")})
    wait_until(lambda: client.responses.retrieve(r.id).status == "in_progress", 10, "not in progress")
    with client.responses.retrieve(r.id, stream=True, starting_after=0) as stream:
        client.responses.cancel(r.id)
        events = list(stream)
    got = client.responses.retrieve(r.id)
    assert got.output_text == "Done <" and got.output[0].status == "incomplete"
    assert events[-1].type == "response.output_item.done" and events[-1].item.status == "incomplete"
    assert events[-1].item.content[0].text == "Done <"
    # a call whose arguments are whole is kept complete; the text after it is cut
    call = xml_call("get_weather", city="Oslo")
    r = client.responses.create(model=gw.model, input="Weather in Oslo?", tools=[WEATHER], background=True,
                                extra_body={"seed": hold(gw, call + "\n")})
    wait_until(lambda: client.responses.retrieve(r.id).output, 10, "no call was written")
    got = client.responses.cancel(r.id)
    assert [i.type for i in got.output] == ["function_call"], got.output
    assert got.output[0].status == "completed" and json.loads(got.output[0].arguments) == {"city": "Oslo"}


def test_a_call_cut_by_max_output_tokens_is_incomplete_and_a_cancelled_answer_continues(gw, client):
    call = xml_call("get_weather", city="Oslo")
    ids = gw.tokenizer.encode(call)
    cut = ids.index(gw.tokenizer.encode("Oslo")[0])  # the output ends inside the parameter's value
    r = client.responses.create(model=gw.model, input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=cut,
                                extra_body={"seed": gw.say(call)})
    assert r.status == "incomplete" and [i.type for i in r.output] == ["function_call"]
    assert r.output[0].status == "incomplete"  # though its arguments so far parse to {}
    # a cancelled response that wrote something is stored and continues from what it kept
    held = client.responses.create(model=gw.model, input="Plan it.", background=True,
                                   extra_body={"seed": hold(gw, "Step one")})
    wait_until(lambda: client.responses.retrieve(held.id).output, 10, "nothing was written")
    client.responses.cancel(held.id)
    child = client.responses.create(model=gw.model, input="Go on.", previous_response_id=held.id,
                                    extra_body={"seed": gw.say("Step two")})
    assert child.output_text == "Step two" and "Step one" in gw.last_prompt()


def test_items_of_the_chain_sent_again_are_openais_duplicate_item_400(gw, client):
    first = client.responses.create(model=gw.model, input="Hi.", extra_body={"seed": gw.say("Hello.")})
    again = [item.model_dump(mode="json", exclude_unset=True) for item in first.output]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=gw.model, previous_response_id=first.id,
                                input=again + [{"role": "user", "content": "And?"}])
    assert e.value.body["param"] == "input[0].id" and "Duplicate item found with id" in e.value.body["message"]
    # without the items sent again the chain goes on
    ok = client.responses.create(model=gw.model, previous_response_id=first.id, input="And?",
                                 extra_body={"seed": gw.say("More.")})
    assert ok.output_text == "More."
