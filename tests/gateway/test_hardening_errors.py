"""A 500 is a gateway bug: its answer carries a request id, and the log has that id with the traceback.

The app is served in-process (aiohttp's test server) with one extra route that
fails the way a bug would; failures caused by input are 400s (see
test_hardening_limits and test_bad_inputs).
"""

from __future__ import annotations

import asyncio
import logging
import re

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ignis.gateway.app import build_app
from ignis.gateway.config import GatewayConfig
from ignis.gateway.tokenizer import ModelFiles


def test_an_unexpected_exception_is_a_500_with_a_request_id_logged_with_its_traceback(demo_files, tmp_path, caplog):
    app = build_app(GatewayConfig(), demo_files, "ignis-demo", f"ipc://{tmp_path}/none.sock")

    async def broken(request: web.Request) -> web.Response:
        return {}["missing"]  # a bug, not the client's doing

    app.router.add_get("/v1/broken", broken)

    async def go():
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/v1/broken")
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.json()

    with caplog.at_level(logging.ERROR, logger="ignis.gateway"):
        status, headers, body = asyncio.run(go())
    assert status == 500
    err = body["error"]
    assert err["type"] == "internal_error" and "Traceback" not in err["message"] and ".py" not in err["message"]
    rid = re.search(r"request id ([0-9a-f]{16})", err["message"]).group(1)
    assert headers["x-request-id"] == rid
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and logged[0].exc_info is not None and logged[0].exc_info[0] is KeyError


RECURSIVE_TEMPLATE = ("{% macro deep(n) %}{% if n > 0 %}{{ deep(n - 1) }}{% endif %}{% endmacro %}"
                      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ deep(m.content | length) }}{{ m.content }}"
                      "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_a_template_that_recurses_on_the_input_is_a_400_not_a_500(demo_files, tmp_path):
    files = ModelFiles(tokenizer=demo_files.tokenizer, chat_template=RECURSIVE_TEMPLATE, generation_config={})
    app = build_app(GatewayConfig(), files, "ignis-demo", f"ipc://{tmp_path}/none.sock")

    async def go(content: str):
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]})
            return resp.status, await resp.json()

    status, body = asyncio.run(go("x" * 5000))
    assert status == 400, body
    assert body["error"]["param"] == "messages" and body["error"]["code"] == "template_failed", body


def test_a_client_gone_mid_answer_is_a_499_and_no_error_in_the_log(demo_files, tmp_path, caplog):
    """A stream's first write can meet a transport the client already closed (aiohttp's
    ClientConnectionResetError): a client going away is no gateway error, it is counted as a 499."""
    from aiohttp.client_exceptions import ClientConnectionResetError

    from ignis.gateway.generation import ClientGone

    app = build_app(GatewayConfig(), demo_files, "ignis-demo", f"ipc://{tmp_path}/none.sock")

    async def reset(request: web.Request) -> web.Response:
        raise ClientConnectionResetError("Cannot write to closing transport")

    async def gone(request: web.Request) -> web.Response:
        raise ClientGone()

    app.router.add_get("/v1/reset", reset)
    app.router.add_get("/v1/gone", gone)

    async def go():
        async with TestClient(TestServer(app)) as client:
            statuses = [(await client.get(path)).status for path in ("/v1/reset", "/v1/gone")]
            metrics = await (await client.get("/metrics")).text()
            return statuses, metrics

    with caplog.at_level(logging.DEBUG):
        statuses, metrics = asyncio.run(go())
    assert statuses == [499, 499]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert 'ignis:gateway_requests_total{endpoint="other",model_name="ignis-demo",status="499"} 2.0' in metrics


def test_a_client_gone_after_the_answer_started_cuts_it_without_a_second_status_line(demo_files, tmp_path):
    """Raised once a stream is under way (its client still connected), the 499 must not be written into
    the body as a second response: the connection is cut where the stream stopped."""
    from ignis.gateway.generation import ClientGone

    app = build_app(GatewayConfig(), demo_files, "ignis-demo", f"ipc://{tmp_path}/none.sock")

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        raise ClientGone()

    app.router.add_get("/v1/streamed", streamed)

    async def go():
        async with TestServer(app) as server:
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET /v1/streamed HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            data = b""
            while chunk := await asyncio.wait_for(reader.read(65536), 30):
                data += chunk
            writer.close()
            return data

    data = asyncio.run(go())
    assert data.startswith(b"HTTP/1.1 200") and b"data: one" in data
    assert data.count(b"HTTP/1.1") == 1, data
