"""The KV events publisher in-process: wire format, sequence numbers, replay, a full queue, and off by default."""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest
import zmq

from ignis.engine.config import EngineConfig
from ignis.engine.kv_events import END_SEQ, KvEventPublisher, binds, encode_batch, open_kv_events
from ignis.engine.reuse.block_events import AllBlocksCleared, BlockRemoved, BlockStored


def endpoints():
    name = uuid.uuid4().hex
    return f"inproc://kv-{name}", f"inproc://kv-replay-{name}"


def recv(sock, timeout_ms=5000):
    assert sock.poll(timeout_ms), "nothing published"
    return sock.recv_multipart()


def subscribed(pub_endpoint):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(pub_endpoint)
    return sub


def test_batches_are_vllm_kv_event_batches_in_order():
    pub_ep, replay_ep = endpoints()
    pub = KvEventPublisher(pub_ep, replay_ep, topic="kv@a@m")
    sub = subscribed(pub_ep)
    try:
        # a subscription takes a moment to reach the PUB socket: publish until the first batch arrives
        deadline = time.monotonic() + 5
        while not sub.poll(20):
            assert time.monotonic() < deadline
            pub.add(AllBlocksCleared())
            pub.flush()
        first_seq = int.from_bytes(sub.recv_multipart()[1], "big")
        while sub.poll(200):
            first_seq = int.from_bytes(sub.recv_multipart()[1], "big")
        pub.add(BlockStored((1, 2), None, tuple(range(8)), 4, "GPU"))
        pub.add(BlockRemoved((2,), "CPU"))
        pub.flush()
        pub.flush()  # nothing collected: no batch
        topic, seq, payload = recv(sub)
        assert topic == b"kv@a@m" and len(seq) == 8 and int.from_bytes(seq, "big") == first_seq + 1
        ts, events, rank = msgpack.unpackb(payload)
        assert abs(ts - time.time()) < 60 and rank == 0
        assert events == [["BlockStored", [1, 2], None, list(range(8)), 4, None, "GPU", None],
                          ["BlockRemoved", [2], "CPU"]]
        assert not sub.poll(100)
    finally:
        sub.close(0)
        pub.close()


def test_replay_resends_from_a_sequence_number_and_ends_with_minus_one():
    pub_ep, replay_ep = endpoints()
    pub = KvEventPublisher(pub_ep, replay_ep, buffer_batches=3)
    for n in range(5):
        pub.add(BlockRemoved((n,), "GPU"))
        pub.flush()
    deadline = time.monotonic() + 5
    while pub.published < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(replay_ep)
    try:
        req.send((3).to_bytes(8, "big"))
        frames = recv(req)
        assert int.from_bytes(frames[0], "big") == 3
        assert msgpack.unpackb(frames[1])[1] == [["BlockRemoved", [3], "GPU"]]
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay_ep)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])  # the buffer keeps the last 3
        got = []
        while True:
            _, seq, payload = recv(dealer)
            if seq == END_SEQ:
                assert payload == b""
                break
            got.append(int.from_bytes(seq, "big"))
        assert got == [2, 3, 4]
        dealer.send_multipart([b"", b"bad"])  # malformed: ignored, the publisher keeps serving
        dealer.send_multipart([b"", (9).to_bytes(8, "big")])
        assert recv(dealer)[1] == END_SEQ
        assert pub.malformed == 1  # counted (the engine's wire_errors_total{socket="kv_events_replay"})
        dealer.close(0)
    finally:
        req.close(0)
        pub.close()


def test_a_full_queue_drops_batches_counts_them_and_leaves_a_gap(monkeypatch, caplog):
    monkeypatch.setattr(KvEventPublisher, "_run", lambda self: None)  # nothing drains the queue
    pub_ep, _ = endpoints()
    pub = KvEventPublisher(pub_ep, max_queue=2)
    try:
        for _ in range(5):
            pub.add(AllBlocksCleared())
            pub.flush()
        assert pub.dropped == 3
        assert [pub._queue.get_nowait()[0] for _ in range(2)] == [0, 1]
        assert pub._next_seq == 5  # the dropped batches used up 2, 3 and 4: the next one sent is 5, a gap
        assert caplog.text.count("batches dropped so far") == 1  # at the 1st drop (then the 10th, 100th, ...)
    finally:
        pub.close(timeout=0.1)


def test_encode_rejects_what_is_not_an_event():
    with pytest.raises(TypeError):
        encode_batch(0.0, ["BlockStored"])


def test_off_by_default_and_bind_rule():
    assert open_kv_events(EngineConfig()) is None
    with pytest.raises(ValueError):
        EngineConfig(kv_events_replay_endpoint="tcp://*:5558")
    with pytest.raises(ValueError):
        EngineConfig(metrics_compat="prometheus")
    assert binds("tcp://*:5557") and binds("ipc:///tmp/x") and binds("inproc://x")
    assert not binds("tcp://router.example:5557")


def test_an_endpoint_in_use_or_malformed_is_a_clear_error():
    pub_ep, replay_ep = endpoints()
    first = KvEventPublisher(pub_ep)
    try:
        with pytest.raises(ValueError, match="cannot open the KV events sockets"):
            KvEventPublisher(pub_ep)
        with pytest.raises(ValueError, match="cannot open the KV events sockets"):
            KvEventPublisher(replay_ep, "tcp://*:not-a-port")
    finally:
        first.close()


def test_sockets_bound_beyond_loopback_are_warned_about_the_replay_one_too(caplog):
    import socket

    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            ports.append(s.getsockname()[1])
    with caplog.at_level("WARNING", logger="ignis.engine"):
        pub = KvEventPublisher(f"tcp://127.0.0.1:{ports[0]}", replay_endpoint=f"tcp://0.0.0.0:{ports[1]}")
        pub.close()
        quiet = KvEventPublisher(f"tcp://127.0.0.1:{ports[2]}")
        quiet.close()
    warned = [r.getMessage() for r in caplog.records if "no authentication" in r.getMessage()]
    assert len(warned) == 1 and f"0.0.0.0:{ports[1]}" in warned[0], warned
