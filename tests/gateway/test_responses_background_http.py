"""Background responses over HTTP (``background: true``) before a scripted engine, with OpenAI's client.

The scripted engine answers by seed (tests.gateway.fake_engine): seed 0 sends
one token and then holds the request until it is aborted, which is a run
still in progress for as long as a test needs; seed 5 fails after two tokens;
seed 2 is refused as too long; any other seed streams ``max_tokens`` tokens.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import openai
import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway, wait_until
from tests.gateway.responses_support import EVENT_MODELS, check_response

BODY = {"model": "ignis-demo", "input": "Say something.", "background": True, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("background")) as g:
        g.client = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        yield g
        g.client.close()


def create(gw, seed: int, **fields):
    """A background response of the scripted engine's ``seed``."""
    return gw.client.responses.create(**dict(BODY, **fields), extra_body={"seed": seed})


def sse_events(raw: bytes) -> list[dict]:
    """The data of each ``event:``/``data:`` pair, the event name checked against its type."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            name, data = block.split("\n")
            event = json.loads(data[len("data: "):])
            assert name == "event: " + event["type"], block
            EVENT_MODELS[event["type"]].model_validate(event)
            events.append(event)
    return events


def replay(gw, rid: str, after: int | None = None) -> list[dict]:
    query = "?stream=true" + (f"&starting_after={after}" if after is not None else "")
    r = http("GET", f"{gw.url}/v1/responses/{rid}{query}")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r
    return sse_events(r.body)


def status_of(gw, rid: str) -> str:
    return gw.client.responses.retrieve(rid).status


def aborted(gw, rid: str) -> bool:
    return any(a.startswith(rid) for a in gw.engine.aborts)


def _streamed_held(s: socket.socket, body: dict) -> str:
    """Start a streamed response of seed 0 (one token, then held) on ``s``; its id once the token came."""
    raw = json.dumps(body).encode()
    s.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%b" % (len(raw), raw))
    got = b""
    while b"response.output_text.delta" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return json.loads(got.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]


FOREGROUND = {"model": "ignis-demo", "input": "Say something.", "stream": True, "seed": 0}


def test_a_background_response_answers_queued_then_completes_and_replays_its_events(gw):
    r = create(gw, 7)
    assert r.background is True and r.status in ("queued", "in_progress") and r.output == []
    wait_until(lambda: status_of(gw, r.id) == "completed", 10, "the background response did not complete")
    done = gw.client.responses.retrieve(r.id)
    assert done.output_text == "_" * 6 and done.usage.output_tokens == 6 and done.background is True
    assert done.completed_at is not None
    events = replay(gw, r.id)
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"], types
    assert types[-1] == "response.completed" and [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "queued" and events[0]["response"]["background"] is True
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "_" * 6
    check_response(events[-1]["response"])
    assert replay(gw, r.id, after=3) == events[4:]  # resumed after sequence number 3
    assert replay(gw, r.id, after=len(events) - 1) == []
    # a finished background response continues a conversation like any stored one
    follow = gw.client.responses.create(model="ignis-demo", input="More.", previous_response_id=r.id,
                                        max_output_tokens=2, extra_body={"seed": 9})
    assert follow.status == "completed" and follow.output_text == "__"


def test_a_streamed_background_response_outlives_its_client_and_resumes(gw):
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        rid = _streamed_held(s, dict(BODY, stream=True, seed=0))
    # the client went: the run goes on, its engine request is not aborted (a request's generation looks for
    # its client every 0.5 s: three looks)
    with pytest.raises(AssertionError, match="went on"):
        wait_until(lambda: aborted(gw, rid) or status_of(gw, rid) != "in_progress", 1.6, "the run went on")
    seen = gw.client.responses.retrieve(rid)
    assert seen.status == "in_progress" and seen.background is True
    assert seen.output_text == "_" and seen.output[0].status == "in_progress"  # the open message, text so far
    cancelled = gw.client.responses.cancel(rid)
    assert cancelled.status == "cancelled"
    # what was generated before the cancel is kept: the engine's one token, and its usage
    assert cancelled.output_text == "_" and cancelled.output[0].status == "incomplete"
    assert cancelled.usage.output_tokens == 1 and cancelled.usage.input_tokens > 0
    wait_until(lambda: aborted(gw, rid), 10, "the cancelled run's engine request was not aborted")
    assert gw.client.responses.cancel(rid).status == "cancelled"  # again: answered as it is
    assert status_of(gw, rid) == "cancelled"
    events = replay(gw, rid)
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert "response.output_text.delta" in types and not any(t.endswith(("completed", "failed")) for t in types)
    assert events[-1]["type"] == "response.output_item.done"  # the cut message, as GET answers it
    assert events[-1]["item"] == gw.client.responses.retrieve(rid).model_dump(mode="json", exclude_unset=True)[
        "output"][0]
    assert replay(gw, rid, after=2) == events[3:]


def test_a_follower_waits_for_events_still_to_come(gw):
    r = create(gw, 0)
    wait_until(lambda: status_of(gw, r.id) == "in_progress", 10, "the run is not in progress")
    with gw.client.responses.retrieve(r.id, stream=True, starting_after=0) as stream:
        first = next(iter(stream))
        assert first.type == "response.queued" and first.sequence_number == 1
        r2 = http("POST", f"{gw.url}/v1/responses/{r.id}/cancel")  # no body, no content type: as curl sends it
        assert r2.status == 200 and json.loads(r2.body)["status"] == "cancelled", r2
        rest = [e.type for e in stream]  # the stream ends with the run
    assert rest[0] == "response.in_progress"


def test_failures_after_the_prompt_was_sent_end_the_run_as_failed(gw):
    r = create(gw, 5)  # two tokens, then the engine fails the request
    wait_until(lambda: status_of(gw, r.id) == "failed", 10, "the run did not fail")
    failed = gw.client.responses.retrieve(r.id)
    assert failed.error.code == "server_error" and "scripted failure" in failed.error.message
    events = replay(gw, r.id)
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == "server_error"
    # the item being written is closed with its text so far, its done events before response.failed
    (message,) = failed.output
    assert message.status == "incomplete" and message.content[0].text
    assert [e["type"] for e in events[-4:-1]] == ["response.output_text.done", "response.content_part.done",
                                                  "response.output_item.done"]
    with pytest.raises(openai.BadRequestError) as e:  # stored, but there is nothing to continue from
        gw.client.responses.create(model="ignis-demo", input="More.", previous_response_id=r.id)
    assert e.value.body["code"] == "response_not_continuable"
    refused = create(gw, 2)  # refused by the engine as too long
    wait_until(lambda: status_of(gw, refused.id) == "failed", 10, "the refused run did not fail")
    assert gw.client.responses.retrieve(refused.id).error.code == "context_length_exceeded"  # what Codex reads
    full = create(gw, 1)  # refused by the engine: its queue is full
    wait_until(lambda: status_of(gw, full.id) == "failed", 10, "the refused run did not fail")
    assert gw.client.responses.retrieve(full.id).error.code == "rate_limit_exceeded"
    metrics = http("GET", gw.url + "/metrics").body.decode()
    failed_count = [line for line in metrics.splitlines()
                    if line.startswith("ignis:gateway_responses_background_total") and 'status="failed"' in line]
    assert failed_count and float(failed_count[0].split()[-1]) >= 3, metrics


def test_bad_background_requests_are_clear_errors(gw):
    with pytest.raises(openai.BadRequestError) as e:
        create(gw, 7, store=False)
    assert e.value.body["param"] == "background" and "store" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # a bad body is a 400 at once, never a failed run
        create(gw, 7, input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
    plain = gw.client.responses.create(model="ignis-demo", input="Hi.", max_output_tokens=2, extra_body={"seed": 7})
    assert plain.background is False
    with pytest.raises(openai.BadRequestError) as e:
        gw.client.responses.cancel(plain.id)
    assert e.value.body["code"] == "not_cancellable"
    r = http("GET", f"{gw.url}/v1/responses/{plain.id}?stream=true")
    assert r.status == 400 and json.loads(r.body)["error"]["param"] == "stream"
    with pytest.raises(openai.NotFoundError):
        gw.client.responses.cancel("resp_unknown")
    bg = create(gw, 7)
    for bad in ("-5", "x"):
        r = http("GET", f"{gw.url}/v1/responses/{bg.id}?stream=true&starting_after={bad}")
        assert r.status == 400 and json.loads(r.body)["error"]["param"] == "starting_after", r


def test_deleting_a_running_background_response_cancels_it(gw):
    r = create(gw, 0)
    wait_until(lambda: status_of(gw, r.id) == "in_progress", 10, "the run is not in progress")
    with pytest.raises(openai.BadRequestError) as e:  # a conversation goes on from a response that has ended
        gw.client.responses.create(model="ignis-demo", input="More.", previous_response_id=r.id)
    assert e.value.body["code"] == "response_in_progress" and e.value.body["param"] == "previous_response_id"
    deleted = gw.client.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    wait_until(lambda: aborted(gw, r.id), 10, "the deleted run's engine request was not aborted")
    with pytest.raises(openai.NotFoundError):
        gw.client.responses.retrieve(r.id)


def test_a_stopping_gateway_cancels_runs_past_its_shutdown_timeout(tmp_path: Path):
    with fake_gateway(tmp_path, "--shutdown-timeout", "1") as g:
        client = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        r = client.responses.create(**BODY, extra_body={"seed": 0})
        wait_until(lambda: client.responses.retrieve(r.id).status == "in_progress", 10, "not in progress")
        client.close()
        assert g.stop() == 0, g.log()
        assert any(a.startswith(r.id) for a in g.engine.aborts), g.log()


def test_a_foreground_response_is_answered_in_progress_while_it_is_made(gw):
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        rid = _streamed_held(s, FOREGROUND)
        seen = gw.client.responses.retrieve(rid)
        assert seen.status == "in_progress" and seen.background is False and seen.output_text == "_"
        items = gw.client.responses.input_items.list(rid)
        assert [i.content[0].text for i in items.data] == ["Say something."]
        more = {"model": "ignis-demo", "input": "More.", "previous_response_id": rid}
        r = http("POST", f"{gw.url}/v1/responses", json.dumps(more).encode(), {"Content-Type": "application/json"})
        assert r.status == 400 and json.loads(r.body)["error"]["code"] == "response_in_progress", r
        r = http("POST", f"{gw.url}/v1/responses/{rid}/cancel")
        assert r.status == 400 and json.loads(r.body)["error"]["code"] == "not_cancellable", r
        r = http("GET", f"{gw.url}/v1/responses/{rid}?stream=true")
        assert r.status == 400 and json.loads(r.body)["error"]["param"] == "stream", r
        # deleted while it is made: it goes on for its client, and is not stored when it ends
        assert gw.client.responses.delete(rid) is None
        with pytest.raises(openai.NotFoundError):
            gw.client.responses.retrieve(rid)
    wait_until(lambda: aborted(gw, rid), 10, "the gone client's engine request was not aborted")
    with pytest.raises(openai.NotFoundError):
        gw.client.responses.retrieve(rid)


def test_a_foreground_response_whose_client_went_is_not_left_in_progress(gw):
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        rid = _streamed_held(s, FOREGROUND)
        assert status_of(gw, rid) == "in_progress"
    wait_until(lambda: aborted(gw, rid), 10, "the gone client's engine request was not aborted")

    def gone() -> bool:
        try:
            gw.client.responses.retrieve(rid)
        except openai.NotFoundError:
            return True
        return False

    wait_until(gone, 10, "a foreground response whose client went is still answered")
