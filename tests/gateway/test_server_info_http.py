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


def get(gw, path, headers=None):
    r = http("GET", gw.url + path, headers=headers or {})
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
        assert get(gw, path)[0] == 401  # its settings name files and hold the chat template: keyed
        status, body = get(gw, path, {"Authorization": f"Bearer {KEY}"})
        assert status == 200 and body["served_model_name"] == "ignis-demo" and "version" in body
        assert "api_key" not in body["server_args"] and KEY not in str(body)
        assert body["internal_states"][0]["max_model_len"] > 0


def test_health_generate_makes_the_engine_generate_a_token(gw):
    before = len(gw.engine.generates)
    assert get(gw, "/health_generate") == (200, {"status": "ok"})
    assert len(gw.engine.generates) == before + 1 and gw.engine.generates[-1].sampling.max_tokens == 1


def test_a_flood_of_health_probes_queues_one_engine_request(gw):
    """Probes at once share one generation (and for a second after): an unkeyed caller cannot fill the queue."""
    import concurrent.futures

    before = len(gw.engine.generates)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: get(gw, "/health_generate"), range(32)))
    assert all(a == (200, {"status": "ok"}) for a in answers)
    assert len(gw.engine.generates) - before < 16  # one per shared answer (a second each), not one per call


def test_a_head_of_flush_cache_flushes_nothing(gw):
    r = http("HEAD", gw.url + "/flush_cache", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status == 405


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
