"""Browsers: a POST that is not application/json is a 415, and CORS is off unless origins are listed.

Probe of issue #26: a keyless server answered ``Content-Type: text/plain``
(a "simple" request any web page may send without a preflight) with 200.
"""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway

CHAT = "/v1/chat/completions"
OK = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
ORIGIN = "https://app.example.com"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type, authorization"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("browsers")) as g:
        yield g


@pytest.fixture(scope="module")
def gw_cors(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("cors"), "--allowed-origins", ORIGIN) as g:
        yield g


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"])
@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_a_post_that_is_not_json_is_415_and_reaches_no_engine(gw, ctype, path):
    before = len(gw.engine.generates)
    r = http("POST", gw.url + path, OK, {"Content-Type": ctype, "Origin": "https://evil.example"})
    assert r.status == 415, r.body[:300]
    assert r.json()["error"]["code"] == "unsupported_media_type"
    assert len(gw.engine.generates) == before
    assert gw.post(CHAT, OK).status == 200


def test_without_allowed_origins_no_cors_header_and_no_preflight(gw):
    r = http("POST", gw.url + CHAT, OK, {"Content-Type": "application/json", "Origin": ORIGIN})
    assert r.status == 200 and not any(k.lower().startswith("access-control-") for k in r.headers), r.headers
    pre = http("OPTIONS", gw.url + CHAT, None, PREFLIGHT)
    assert pre.status == 405 and not any(k.lower().startswith("access-control-") for k in pre.headers)


def test_listed_origins_get_preflights_and_headers_others_do_not(gw_cors):
    pre = http("OPTIONS", gw_cors.url + CHAT, None, PREFLIGHT)
    assert pre.status == 204, pre.body
    assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
    other = http("OPTIONS", gw_cors.url + CHAT, None, dict(PREFLIGHT, Origin="https://evil.example"))
    assert other.status == 403 and "Access-Control-Allow-Origin" not in other.headers
    r = http("POST", gw_cors.url + CHAT, OK, {"Content-Type": "application/json", "Origin": ORIGIN})
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == ORIGIN and r.headers["Vary"] == "Origin"
    stream = http("POST", gw_cors.url + CHAT, json.dumps({**json.loads(OK), "stream": True}).encode(),
                  {"Content-Type": "application/json", "Origin": ORIGIN})
    assert stream.status == 200 and stream.headers["Access-Control-Allow-Origin"] == ORIGIN
    evil = http("POST", gw_cors.url + CHAT, OK, {"Content-Type": "application/json", "Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in evil.headers


def test_the_sdks_browser_requests_clear_their_preflight_and_their_ids_can_be_read(gw_cors):
    """The OpenAI JS SDK sends x-stainless-* headers, Anthropic's TS SDK anthropic-dangerous-direct-browser-access,
    both may send X-Request-Id; a stored response is deleted with DELETE; a page reads the request's id back."""
    asked = "content-type, authorization, x-stainless-os, x-stainless-retry-count, x-request-id, " \
            "anthropic-dangerous-direct-browser-access"
    pre = http("OPTIONS", gw_cors.url + CHAT, None, dict(PREFLIGHT, **{"Access-Control-Request-Headers": asked}))
    allowed = {h.strip().lower() for h in pre.headers["Access-Control-Allow-Headers"].split(",")}
    assert pre.status == 204 and {h.strip() for h in asked.split(",")} <= allowed
    assert "Access-Control-Request-Headers" in pre.headers["Vary"]
    delete = http("OPTIONS", gw_cors.url + "/v1/responses/resp_x", None,
                  dict(PREFLIGHT, **{"Access-Control-Request-Method": "DELETE"}))
    assert delete.status == 204 and "DELETE" in delete.headers["Access-Control-Allow-Methods"]
    # a header name that is not one (a value smuggled in) is left out
    odd = http("OPTIONS", gw_cors.url + CHAT, None, dict(PREFLIGHT, **{"Access-Control-Request-Headers": "a b, x:y"}))
    assert "a b" not in odd.headers["Access-Control-Allow-Headers"] and "x:y" not in odd.headers["Access-Control-Allow-Headers"]
    r = http("POST", gw_cors.url + CHAT, OK, {"Content-Type": "application/json", "Origin": ORIGIN,
                                              "X-Request-Id": "page-1"})
    assert r.status == 200 and r.headers["X-Request-Id"] == "page-1"
    assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]


def test_a_compressed_body_is_read_and_an_unknown_coding_is_a_415(gw):
    import gzip
    import zlib

    before = len(gw.engine.generates)
    for coding, body in (("gzip", gzip.compress(OK)), ("deflate", zlib.compress(OK))):
        r = http("POST", gw.url + CHAT, body, {"Content-Type": "application/json", "Content-Encoding": coding})
        assert r.status == 200, (coding, r.body[:300])
    assert len(gw.engine.generates) == before + 2
    for coding in ("zzz", "x-gzip", "gzip, identity"):  # none of them decoded by aiohttp: never read raw
        r = http("POST", gw.url + CHAT, gzip.compress(OK), {"Content-Type": "application/json",
                                                           "Content-Encoding": coding})
        assert r.status == 415 and r.json()["error"]["code"] == "unsupported_content_encoding", (coding, r.body)
    assert len(gw.engine.generates) == before + 2
