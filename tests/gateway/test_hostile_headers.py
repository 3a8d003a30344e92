"""Header bytes that are not text, and paths that carry newlines: a clear 4xx, no traceback, no forged log line.

Through a real gateway (a fake engine behind it) spoken to over raw sockets,
since an HTTP client would not send such bytes.
"""

from __future__ import annotations

import pytest

from tests.gateway.hardening_support import fake_gateway, read_status

KEY = "sk-hostile-headers"
FORGED = "2026-01-01 00:00:00,000 gateway CRITICAL FORGED"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("hostile"), "--api-key", KEY) as g:
        yield g


def _ask(gw, head: bytes) -> int:
    sock = gw.connect()
    try:
        sock.sendall(head)
        return read_status(sock, 10)
    finally:
        sock.close()


def test_a_key_that_is_not_utf8_is_a_401_and_a_forged_path_forges_no_log_line(gw):
    path = "/v1/models%0A" + FORGED.replace(" ", "%20") + "%1B[31m"
    for header in (b"Authorization: Bearer \xff\xfe", b"x-api-key: \xc3\x28"):
        head = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n"
        assert _ask(gw, head) == 401
    log = gw.log()
    assert "Traceback" not in log, log[-3000:]
    assert not any(line.startswith(FORGED) for line in log.splitlines()), log[-3000:]


@pytest.mark.parametrize("method, path", [("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                          ("POST", "/invocations"), ("GET", "/health_generate")])
def test_an_expectation_that_is_not_text_is_a_417_on_every_route(gw, method, path):
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 10\r\nExpect: 100-\xff\r\n\r\n")
    assert _ask(gw, head) == 417
    assert "Traceback" not in gw.log()


def test_a_cache_key_beside_an_authorization_that_is_not_text_is_served(gw):
    """The key came as x-api-key; the Authorization header beside it (stale, not UTF-8) still names the
    caller of a prompt_cache_key, as the bytes it holds."""
    import json

    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "prompt_cache_key": "session-1"}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: " + KEY.encode()
            + b"\r\nAuthorization: Bearer \xff\xfe\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    assert _ask(gw, head) == 200
    assert "Traceback" not in gw.log()
