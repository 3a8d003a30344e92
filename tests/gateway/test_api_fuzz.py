"""The gateway's HTTP API fuzzed from its own /openapi.json (schemathesis), in front of a fake engine.

schemathesis generates requests for every documented operation from the
document's schemas (valid bodies and invalid ones: wrong types, out of
range, missing fields, odd strings) and checks each answer: never a 5xx, a
documented status and content type, a JSON answer that conforms to its
schema. Afterwards the gateway still answers a valid request. The engine
answers every request with a few tokens, whatever the sampling, so what is
fuzzed is the gateway. A few hundred requests here; ``IGNIS_LONG_TESTS=1``
raises it past a thousand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ignis.shared.wire import Finished, Generate, StreamTokens, TokenBatch, Usage
from tests.gateway.conftest import http
from tests.gateway.fake_engine import UNDERSCORE, FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.gateway.tools_http_support import model_dir

LONG = os.environ.get("IGNIS_LONG_TESTS") == "1"
EXAMPLES = 150 if LONG else 12
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"

pytest.importorskip("schemathesis")


class AnyRequestEngine(FakeEngine):
    """Answers every Generate with at most three tokens and a stop, whatever its seed."""

    def _answer(self, msg: Generate, peer: bytes) -> None:
        n = min(msg.sampling.max_tokens, 3)
        for _ in range(n):
            self.channel.send(TokenBatch((StreamTokens(msg.id, (UNDERSCORE,)),)), peer)
        self.channel.send(Finished(msg.id, "stop", Usage(len(msg.prompt_ids), n, 0)), peer)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    path = model_dir(tmp, "qwen3_5")
    engine = AnyRequestEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--model", str(path))
    try:
        yield engine, proc, url, tmp
    finally:
        stop(proc)
        engine.close()


def test_openapi_document_has_the_bodies_and_answers_of_every_route(gateway):
    _, _, url, _ = gateway
    doc = http("GET", url + "/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["messages"] and body["properties"]["temperature"]["maximum"] == 2
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["object"] == \
        {"const": "chat.completion"}
    assert "error" in chat["responses"]["default"]["content"]["application/json"]["schema"]["properties"]
    for path in ("/v1/completions", "/v1/responses"):
        assert doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"]
    completions = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for props in (body["properties"], completions["properties"]):  # vLLM's structured-output fields
        assert props["structured_outputs"]["properties"]["choice"]["minItems"] == 1 and "guided_regex" in props


def test_schemathesis_finds_no_server_error_and_every_answer_conforms(gateway):
    engine, proc, url, tmp = gateway
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    report = tmp / "st-events.ndjson"
    cmd = [st, "run", url + "/openapi.json", "--checks", CHECKS, "--max-examples", str(EXAMPLES),
           "--phases", "examples,coverage,fuzzing", "--seed", "7", "--workers", "1", "--generation-database", "none",
           "--request-timeout", "20", "--suppress-health-check", "all", "--no-color",
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    proc_st = subprocess.run(cmd, capture_output=True, text=True, timeout=900 if LONG else 300,
                             env=dict(os.environ, SCHEMATHESIS_HOOKS=""))
    out = proc_st.stdout + proc_st.stderr
    assert proc_st.returncode == 0, out[-6000:]
    sent = _requests_sent(report)
    print(f"schemathesis: {sent} requests, exit 0")
    assert sent >= (1000 if LONG else 150), f"only {sent} requests were generated"
    assert proc.poll() is None, "the gateway died"
    # and it still answers a valid request
    ok = http("POST", url + "/v1/chat/completions",
              json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
              {"Content-Type": "application/json"})
    assert ok.status == 200 and ok.json()["object"] == "chat.completion", ok.body


def _requests_sent(report: Path) -> int:
    """Requests made, from schemathesis' ndjson event log (one interaction per request)."""
    n = 0
    for line in report.read_text().splitlines():
        n += line.count('"request":')
    return n


async def test_the_document_follows_the_model_names_served():
    """An adapter loaded or unloaded while serving: the ``model`` enum was the first request's for good."""
    from types import SimpleNamespace

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from ignis.gateway.openapi import openapi
    from ignis.gateway.request_schemas import REQUESTS
    from ignis.gateway.state import STATE

    async def chat(request):
        """Chat."""
        return web.json_response({})

    app = web.Application()
    app[STATE] = SimpleNamespace(names=["base"])
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post("/v1/chat/completions", chat)
    assert "model" in REQUESTS["/v1/chat/completions"]["properties"]
    async with TestClient(TestServer(app)) as client:
        def models(doc):
            body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
            return body["schema"]["properties"]["model"]["enum"]

        assert models(await (await client.get("/openapi.json")).json()) == ["base"]
        app[STATE].names = ["base", "adapter"]
        assert models(await (await client.get("/openapi.json")).json()) == ["base", "adapter"]
