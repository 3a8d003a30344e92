"""Client-side checks of /v1/responses answers, shared by the test_responses_* modules.

``raw_events`` posts a streamed request and reads the SSE stream as sent
(``event:`` and ``data:`` lines); ``check_events`` validates every event with
the openai package's own models (strictly, not the client's lenient
construction) and checks the framing: the ``event:`` name is the ``type``,
sequence numbers count from 0, created and in_progress come first and one
terminal event last. ``check_response`` validates a response object.
"""

from __future__ import annotations

import json
import typing
import urllib.request

from openai.types.responses import Response, ResponseStreamEvent

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
EVENT_MODELS = {typing.get_args(m.model_fields["type"].annotation)[0]: m
                for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}
"""Event type -> the openai package's model of it."""


def raw_events(url: str, body: dict, api_key: str = "unused", timeout: float = 120) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event of a streamed POST /v1/responses."""
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/responses", data=json.dumps(dict(body, stream=True)).encode(),
                                 method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, block
        events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return events


def check_response(obj: dict) -> Response:
    r = Response.model_validate(obj)
    assert r.object == "response" and r.id.startswith("resp_")
    return r


def check_events(events: list[tuple[str, dict]]) -> list:
    """The events as the openai models; raises on any framing or model error."""
    parsed = []
    for i, (name, data) in enumerate(events):
        assert name == data["type"], (name, data)
        assert data["sequence_number"] == i, (i, data)
        parsed.append(EVENT_MODELS[data["type"]].model_validate(data))
    types = [t for t, _ in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in TERMINAL and sum(t in TERMINAL for t in types) == 1, types
    check_response(events[-1][1]["response"])
    return parsed


def item_events(events: list[tuple[str, dict]]) -> list[str]:
    """The event types between in_progress and the terminal event."""
    return [t for t, _ in events[2:-1]]


def collapsed(types: list[str]) -> list[str]:
    """``types`` with runs of one delta event type kept once."""
    out: list[str] = []
    for t in types:
        if not (out and out[-1] == t and t.endswith(".delta")):
            out.append(t)
    return out
