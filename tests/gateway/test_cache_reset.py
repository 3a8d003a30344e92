"""The cache-reset routes (gateway.cache_reset) in front of a scripted engine: what each answer becomes.

The engine's side (resets only when idle, every tier) is tested in
tests/engine/test_cache_flushes.py and tests/engine/test_tiers_e2e.py; a
served demo model's reset in tests/gateway/test_reuse_http.py.
"""

from __future__ import annotations

import pytest

from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop

KEY = "reset-key"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reset")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--api-key", KEY)
    try:
        yield engine, url
    finally:
        stop(proc)
        engine.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_a_reset_answers_the_entries_the_engine_dropped(gateway):
    engine, url = gateway
    engine.flush_refusal, engine.flush_entries = None, 5
    before = engine.flushes
    reply = http("POST", url + "/reset_prefix_cache", headers=AUTH)
    assert reply.status == 200 and reply.json() == {"flushed": True, "retained_entries": 5}
    assert http("GET", url + "/flush_cache", headers=AUTH).json() == {"flushed": True, "retained_entries": 5}
    assert engine.flushes == before + 2


def test_a_busy_engine_is_a_409_and_nothing_else_changes(gateway):
    engine, url = gateway
    engine.flush_refusal = "2 requests are in flight"
    try:
        reply = http("POST", url + "/flush_cache", headers=AUTH)
        assert reply.status == 409
        err = reply.json()["error"]
        assert err["code"] == "engine_busy" and "2 requests are in flight" in err["message"]
        assert "retry when the engine is idle" in err["message"]
    finally:
        engine.flush_refusal = None
    assert http("GET", url + "/health").status == 200


def test_resets_need_the_key_and_are_in_the_openapi_document(gateway):
    engine, url = gateway
    before = engine.flushes
    for method, path in (("POST", "/reset_prefix_cache"), ("GET", "/flush_cache")):
        assert http(method, url + path).status == 401
        assert http(method, url + path, headers={"Authorization": "Bearer wrong"}).status == 401
    assert engine.flushes == before
    doc = http("GET", url + "/openapi.json").json()
    for method, path in (("post", "/reset_prefix_cache"), ("post", "/flush_cache"), ("get", "/flush_cache")):
        op = doc["paths"][path][method]
        assert op["security"] == [{"bearer": []}] and "requestBody" not in op
        assert "409" in op["responses"]
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["required"] == [
            "flushed", "retained_entries"]
