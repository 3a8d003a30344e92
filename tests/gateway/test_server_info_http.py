"""vLLM's and SGLang's operational routes (``gateway.server_info``) before the scripted engine."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway

KEY = "server-info-key"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("server-info"), env={"IGNIS_API_KEY": KEY}) as g:
        yield g


def get(gw, path):
    r = http("GET", gw.url + path)
    return r.status, r.json()


def test_load_routes_answer_in_their_servers_shapes(gw):
    status, body = get(gw, "/load")
    assert status == 200 and body == {"server_load": 0}
    status, body = get(gw, "/get_load")
    assert status == 200 and body[0]["dp_rank"] == 0 and body[0]["num_reqs"] == 0
    assert get(gw, "/is_sleeping") == (200, {"is_sleeping": False})


def test_model_and_server_info_name_the_model_and_keep_secrets_out(gw):
    status, info = get(gw, "/get_model_info")
    assert status == 200 and info["is_generation"] is True and info["served_model_name"] == "ignis-demo"
    for path in ("/get_server_info", "/server_info"):
        status, body = get(gw, path)
        assert status == 200 and body["served_model_name"] == "ignis-demo" and "version" in body
        assert "api_key" not in body["server_args"] and KEY not in str(body)
        assert body["internal_states"][0]["max_model_len"] > 0


def test_health_generate_makes_the_engine_generate_a_token(gw):
    before = len(gw.engine.generates)
    assert get(gw, "/health_generate") == (200, {"status": "ok"})
    assert len(gw.engine.generates) == before + 1 and gw.engine.generates[-1].sampling.max_tokens == 1


def test_invocations_route_by_body_and_need_the_key(gw):
    key = {"Authorization": f"Bearer {KEY}"}
    chat = gw.post("/invocations", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, key)
    assert chat.status == 200 and chat.json()["object"] == "chat.completion"
    done = gw.post("/invocations", {"prompt": "hi", "max_tokens": 2}, key)
    assert done.status == 200 and done.json()["object"] == "text_completion"
    assert gw.post("/invocations", {"input": "hi"}, key).status == 400
    assert gw.post("/invocations", {"prompt": "hi", "max_tokens": 2}).status == 401


def test_post_ping_is_the_health_check_without_a_body_or_a_key(gw):
    r = http("POST", gw.url + "/ping", b"", {})
    assert r.status == 200 and r.json() == {"status": "ok"}
