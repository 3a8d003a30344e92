"""Bounded work before expensive work: huge bodies, text past the context, deep schemas, many messages.

A real gateway before the scripted engine (context 4096 tokens: body limit
128 KiB, 2,097,152 characters: 4 x the longest token's 128 a token). Probes of issue #26: two 10 MB bodies at once
must each be answered 4xx within 1 s while ``/health`` keeps answering and
the gateway's RSS barely moves; a tool schema nested ~1,010 levels is a 400
naming the field, not a 500.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.gateway.conftest import http
from tests.gateway.hardening_support import fake_gateway, post_head, read_status

CHAT = "/v1/chat/completions"
TEN_MB = 10 << 20


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("limits")) as g:
        yield g


@pytest.fixture(scope="module")
def gw_big(tmp_path_factory):
    """The body limit raised past the probe's bodies: the character budget must refuse them instead."""
    with fake_gateway(tmp_path_factory.mktemp("limits-big"), "--max-request-bytes", "32M") as g:
        yield g


def ten_mb_chat() -> bytes:
    head = b'{"max_tokens": 2, "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + b"x" * (TEN_MB - len(head) - len(tail)) + tail


def probe_two_big_bodies(gw, body: bytes, chunked: bool = False) -> tuple[list[tuple[int, float]], float]:
    """Two big bodies sent at once on raw sockets, /health polled all along: [(status, seconds)], the
    slowest /health in seconds."""
    results: list[tuple[int, float]] = []
    done = threading.Event()

    def send():
        sock = gw.connect()
        started = time.monotonic()
        try:
            if chunked:
                sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Transfer-Encoding: chunked\r\n\r\n".encode())
                for at in range(0, len(body), 1 << 20):
                    piece = body[at:at + (1 << 20)]
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            else:
                sock.sendall(post_head(CHAT, "x", len(body)) + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and stopped reading: the status is still there to read
        results.append((read_status(sock, 10), time.monotonic() - started))
        sock.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    worst = 0.0

    def watch_health():
        nonlocal worst
        while not done.is_set():
            t = time.monotonic()
            assert http("GET", gw.url + "/health", timeout=5).status == 200
            worst = max(worst, time.monotonic() - t)

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    done.set()
    watcher.join(10)
    return results, worst


def test_two_10mb_bodies_are_refused_at_once_by_the_context_sized_limit(gw):
    base = gw.rss_kb()
    results, worst_health = probe_two_big_bodies(gw, ten_mb_chat())
    assert [s for s, _ in results] == [413, 413], results
    assert max(t for _, t in results) < 1.0, results
    assert worst_health < 0.1, worst_health
    assert gw.rss_kb("VmHWM") - base < 200 << 10


def test_a_chunked_body_is_cut_off_at_the_limit(gw):
    results, _ = probe_two_big_bodies(gw, ten_mb_chat(), chunked=True)
    assert [s for s, _ in results] == [413, 413], results
    assert max(t for _, t in results) < 1.0, results


def test_past_a_raised_body_limit_the_character_budget_refuses_before_rendering(gw_big):
    base = gw_big.rss_kb()
    results, worst_health = probe_two_big_bodies(gw_big, ten_mb_chat())
    assert [s for s, _ in results] == [400, 400], results
    assert max(t for _, t in results) < 1.0, results
    # each 10 MB body is parsed (about 50 ms holding the interpreter) before its characters are counted
    assert worst_health < 0.5, worst_health
    assert gw_big.rss_kb("VmHWM") - base < 200 << 10
    # past 4 x 128 characters a token (the vocabulary's longest token, times Unicode's composition): no
    # tokenization could fit it
    r = gw_big.post(CHAT, {"messages": [{"role": "user", "content": "y" * (4 * 128 * 4096)}]})
    assert r.status == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "(2097152: 512 per token at most)" in err["message"], err
    assert not gw_big.engine.generates


def nested_schema(levels: int) -> str:
    """A JSON schema text nesting ``levels`` JSON objects (built as text: json.dumps recurses)."""
    pairs = (levels - 1) // 2
    return '{"type": "object", "properties": {"a": ' * pairs + '{"type": "string"}' + "}}" * pairs


def test_a_tool_schema_nested_1010_levels_is_a_400_naming_the_field(gw):
    raw = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": "function", '
           '"function": {"name": "f", "parameters": ' + nested_schema(1011) + "}}]}")
    assert raw.count("{") >= 1010
    r = gw.post(CHAT, raw.encode())
    assert r.status == 400, r.body[:300]
    err = r.json()["error"]
    assert err["param"] == "tools[0].function.parameters" and err["code"] == "nesting_too_deep", err
    ok = gw.post(CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                        "tools": [{"type": "function", "function": {"name": "f",
                                                                    "parameters": json.loads(nested_schema(25))}}]})
    assert ok.status == 200, ok.body[:300]


@pytest.mark.parametrize("field,param", [
    ({"response_format": {"type": "text", "x": json.loads("[" * 200 + "]" * 200)}}, "response_format"),
    ({"chat_template_kwargs": {"x": json.loads("[" * 200 + "]" * 200)}}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":' + "[" * 900 + "]" * 900 + "}"}}
    ]}, {"role": "tool", "tool_call_id": "c", "content": "r"}]}, "messages[1].tool_calls[0].function.arguments"),
])
def test_other_deep_fields_are_400s_naming_them(gw, field, param):
    r = gw.post(CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **field})
    assert r.status == 400, r.body[:300]
    assert r.json()["error"]["param"] == param


def test_too_many_messages_are_refused_by_count(gw):
    r = gw.post(CHAT, {"messages": [{"role": "user", "content": ""}] * 1025, "max_tokens": 2})
    assert r.status == 400
    err = r.json()["error"]
    assert err["param"] == "messages" and err["code"] == "too_many_messages" and "1024" in err["message"], err


def _expect_head(length: int, path: str = CHAT) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            f"Expect: 100-continue\r\n\r\n").encode()


def _read_head(sock, timeout: float = 10) -> bytes:
    """Bytes up to the end of the first response head on ``sock``."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_an_announced_body_past_the_limit_is_refused_before_it_is_sent(gw):
    """curl asks first (Expect: 100-continue) for big bodies: the answer is the 413, not a go-ahead."""
    for path in (CHAT, "/v1/messages"):
        sock = gw.connect()
        sock.sendall(_expect_head(TEN_MB, path))
        head = _read_head(sock)
        assert head.startswith(b"HTTP/1.1 413"), head
        sock.settimeout(10)
        rest = b""
        while b"request_too_large" not in rest and b"request_too_large" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            rest += chunk
        assert b"request_too_large" in head + rest
        sock.close()


def test_an_announced_body_within_the_limit_is_asked_for_and_answered(gw):
    body = json.dumps({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sock = gw.connect()
    sock.sendall(_expect_head(len(body)))
    assert _read_head(sock).startswith(b"HTTP/1.1 100 Continue"), "no go-ahead"
    sock.sendall(body)
    assert read_status(sock, 30) == 200
    sock.close()
