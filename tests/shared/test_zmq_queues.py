"""Channels over real sockets: messages flow both ways, garbage is answered or counted, the thread survives."""

from __future__ import annotations

import queue

import pytest
import zmq

from ignis.shared.wire import (
    ENGINE_TO_GATEWAY,
    GATEWAY_TO_ENGINE,
    Abort,
    ErrorReply,
    Generate,
    SamplingParams,
    StreamTokens,
    TokenBatch,
    decode,
    encode,
)
from ignis.shared import tier_wire
from ignis.shared.wire_fields import WireError
from ignis.shared.zmq_queues import Channel, bind_router, connect_dealer

TIMEOUT = 30.0  # generous: the machine may be busy


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


@pytest.fixture(params=["ipc", "inproc"])
def endpoint(request, tmp_path):
    if request.param == "ipc":
        return f"ipc://{tmp_path}/test-engine.sock"
    return f"inproc://test-engine-{id(request)}"


def _raw_dealer(ctx, endpoint) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
    sock.connect(endpoint)
    return sock


def test_messages_flow_both_ways(ctx, endpoint):
    with bind_router(ctx, endpoint, GATEWAY_TO_ENGINE, name="engine") as engine, \
            connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY, name="gateway") as gateway:
        gen = Generate(id="r1", prompt_ids=(1, 2, 3), sampling=SamplingParams(max_tokens=4))
        gateway.send(gen)
        got = engine.get(timeout=TIMEOUT)
        assert got.message == gen and got.peer is not None
        reply = TokenBatch(streams=(StreamTokens("r1", (9,)),))
        engine.send(reply, peer=got.peer)
        back = gateway.get(timeout=TIMEOUT)
        assert back.message == reply and back.peer is None


def test_router_answers_garbage_and_keeps_running(ctx, endpoint):
    with bind_router(ctx, endpoint, GATEWAY_TO_ENGINE, name="engine") as engine:
        peer = _raw_dealer(ctx, endpoint)
        garbage = [[b"\x80\x04pickle"], [b"{}", b"x"], [b'{"type":"abort","v":99,"id":"x"}'], encode(TokenBatch(streams=()))]
        for frames in garbage:
            peer.send_multipart(frames)
            answer = decode(peer.recv_multipart())
            assert isinstance(answer, ErrorReply) and answer.message
        assert "not accepted" in answer.message  # engine->gateway type sent to the engine
        # An ErrorReply sent to the router is counted but never answered (no ping-pong).
        peer.send_multipart(encode(ErrorReply("you are wrong")))
        peer.send_multipart(encode(Abort("r7")))
        assert engine.get(timeout=TIMEOUT).message == Abort("r7")
        assert engine.garbage_count == len(garbage) + 1
        peer.setsockopt(zmq.RCVTIMEO, 200)
        with pytest.raises(zmq.Again):
            peer.recv_multipart()
        peer.close()


def test_dealer_counts_garbage_without_answering(ctx, endpoint):
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
    router.bind(endpoint)
    with connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY, name="gateway") as gateway:
        gateway.send(Abort("hello"))
        ident, *frames = router.recv_multipart()
        assert decode(frames) == Abort("hello")
        router.send_multipart([ident, b"garbage"])
        router.send_multipart([ident, *encode(ErrorReply("fine"))])
        assert gateway.get(timeout=TIMEOUT).message == ErrorReply("fine")
        assert gateway.garbage_count == 1 and "not JSON" in gateway.last_garbage
    router.close()


def test_a_tierd_router_answers_in_its_own_protocol(ctx, endpoint):
    with bind_router(ctx, endpoint, tier_wire.ENGINE_TO_TIERD, name="tierd") as tierd:
        assert tierd.protocol is tier_wire.ENGINE_TIERD
        peer = _raw_dealer(ctx, endpoint)
        for frames, words in ((encode(Abort("r1")), "unknown message type 'abort'"),
                              ([b'{"type":"tier_drop","v":1,"req":1}'], "missing field 'key'")):
            peer.send_multipart(frames)
            answer = tier_wire.decode(peer.recv_multipart())
            assert isinstance(answer, tier_wire.ErrorReply) and words in answer.message
        drop = tier_wire.Drop(2, "0123456789abcdef")
        peer.send_multipart(tier_wire.encode(drop))
        assert tierd.get(timeout=TIMEOUT).message == drop
        assert tierd.garbage_count == 2
        with pytest.raises(WireError, match="not a wire message of the engine-tierd protocol"):
            tierd.send(Abort("r1"), peer=b"p")
        peer.close()


def test_send_checks_peer_and_closed(ctx, endpoint):
    engine = bind_router(ctx, endpoint, GATEWAY_TO_ENGINE).start()
    with pytest.raises(ValueError, match="peer identity"):
        engine.send(ErrorReply("x"))
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.send(ErrorReply("x"), peer=b"p")
    pair = ctx.socket(zmq.PAIR)
    with pytest.raises(ValueError, match="at least one"):
        Channel(pair, ())
    with pytest.raises(ValueError, match="not of exactly one"):
        Channel(pair, (ErrorReply,))
    pair.close()


def test_notify_is_called_per_message(ctx, endpoint):
    calls = queue.Queue()
    with bind_router(ctx, endpoint, GATEWAY_TO_ENGINE, notify=lambda: calls.put(1)) as engine, \
            connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY) as gateway:
        for i in range(3):
            gateway.send(Abort(f"r{i}"))
        for _ in range(3):
            calls.get(timeout=TIMEOUT)
        assert [engine.get(timeout=TIMEOUT).message.id for _ in range(3)] == ["r0", "r1", "r2"]


def test_many_messages_keep_order(ctx, endpoint):
    with bind_router(ctx, endpoint, GATEWAY_TO_ENGINE) as engine, \
            connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY) as gateway:
        for i in range(2000):
            gateway.send(Abort(f"r{i}"))
        envelopes = [engine.get(timeout=TIMEOUT) for _ in range(2000)]
        assert [e.message.id for e in envelopes] == [f"r{i}" for i in range(2000)]
        peer = envelopes[0].peer
        for i in range(2000):
            engine.send(TokenBatch(streams=(StreamTokens(f"r{i}", (i,)),)), peer=peer)
        got = [gateway.get(timeout=TIMEOUT).message.streams[0].token_ids[0] for _ in range(2000)]
        assert got == list(range(2000))


def test_a_gone_peer_is_one_warning_not_one_per_message(ctx, endpoint, caplog):
    """A gateway that died with streams open: every token batch queued for it fails to send; the log says
    so once (the engine's gateway watch acts on ``unreachable``), the rest at debug level."""
    with bind_router(ctx, endpoint, GATEWAY_TO_ENGINE, name="engine") as engine, \
            connect_dealer(ctx, endpoint, ENGINE_TO_GATEWAY, name="gateway") as gateway:
        gateway.send(Abort("hello"))
        peer = engine.get(timeout=TIMEOUT).peer
        with caplog.at_level("DEBUG", logger="ignis.shared.zmq_queues"):
            for i in range(5):
                engine.send(TokenBatch(streams=(StreamTokens(f"r{i}", (i,)),)), peer=b"gone-gateway")
            engine.send(TokenBatch(streams=(StreamTokens("live", (7,)),)), peer=peer)
            assert gateway.get(timeout=TIMEOUT).message.streams[0].id == "live"  # sent after the five failed
        failed = [r for r in caplog.records if "send failed" in r.getMessage()]
        assert [r.levelname for r in failed] == ["WARNING"] + ["DEBUG"] * 4
        assert b"gone-gateway" in engine.unreachable


@pytest.mark.parametrize("endpoint, exposed", [
    ("tcp://*:5557", True), ("tcp://0.0.0.0:5557", True), ("tcp://10.0.0.4:5557", True), ("tcp://host:5557", True),
    ("tcp://[::]:5557", True), ("tcp://127.0.0.1:5557", False), ("tcp://localhost:5557", False),
    ("tcp://[::1]:5557", False), ("ipc:///run/ignis/x.sock", False), ("inproc://x", False)])
def test_a_tcp_endpoint_beyond_loopback_is_open_to_the_network(endpoint, exposed):
    from ignis.shared.zmq_queues import open_to_network

    assert open_to_network(endpoint) is exposed


def test_a_router_bound_beyond_loopback_says_it_takes_anyone(ctx, caplog):
    import socket

    from ignis.shared.zmq_queues import bind_router

    with socket.socket() as s:  # a free port
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
    with caplog.at_level("WARNING"):
        ch = bind_router(ctx, f"tcp://0.0.0.0:{port}", GATEWAY_TO_ENGINE)
    ch.close()
    assert "no authentication" in caplog.text
