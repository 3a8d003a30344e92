"""A gateway whose grammar library (llguidance) cannot be imported still serves, and says what it cannot do.

The gateway is started with a ``llguidance`` module on PYTHONPATH that raises ImportError. It must come up
(with a warning naming the missing library), answer plain chats, refuse constrained output
(``response_format`` json_schema, vLLM's ``structured_outputs``) with a 400 naming the cause, and serve
forced and strict tool calls unheld: no grammar sent to the engine, counted in
``ignis:gateway_grammar_unheld_total`` and noted in the request's done line.
"""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.gateway.tools_http_support import model_dir

TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}}]
CHAT = {"model": "qwen3_5", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("no-llguidance")
    shadow = tmp / "shadow"
    shadow.mkdir()
    (shadow / "llguidance.py").write_text('raise ImportError("llguidance is blocked for this test")\n')
    path = model_dir(tmp, "qwen3_5")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(shadow))
        proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--model", str(path),
                                  "--served-model-name", "qwen3_5")
    try:
        yield engine, url, proc
    finally:
        stop(proc)
        engine.close()


def _post(url: str, body: dict):
    return http("POST", url + "/v1/chat/completions", json.dumps(body).encode(),
                {"Content-Type": "application/json"})


def _unheld(url: str) -> float:
    text = http("GET", url + "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ignis:gateway_grammar_unheld_total"))


def test_the_gateway_starts_and_says_the_library_is_missing(gateway):
    _, url, proc = gateway
    log = proc.out_path.read_text()
    assert "llguidance is blocked for this test" in log and "constrained output" in log, log
    r = _post(url, CHAT)
    assert r.status == 200, r.body


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"regex": "[0-9]+"}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
])
def test_constrained_output_is_a_400_naming_the_cause(gateway, extra):
    engine, url, _ = gateway
    before = len(engine.generates)
    r = _post(url, CHAT | extra)
    assert r.status == 400, r.body
    err = r.json()["error"]
    assert err["code"] == "structured_outputs_unavailable" and "llguidance" in err["message"], err
    assert len(engine.generates) == before  # nothing reached the engine
    assert _post(url, CHAT).status == 200  # and the gateway serves on


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"])
def test_tool_calls_a_grammar_would_hold_are_served_unheld_and_said_so(gateway, choice):
    engine, url, _ = gateway
    before = _unheld(url)
    r = _post(url, CHAT | {"tools": TOOLS, "tool_choice": choice})  # the tool is strict: auto is held too
    assert r.status == 200, r.body
    sent = engine.generates[-1]
    assert sent.grammar is None
    assert "not held (llguidance is not installed)" in (sent.notes or ""), sent.notes
    assert _unheld(url) == before + 1
