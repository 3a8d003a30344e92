"""KV events of a real engine (and tierd), read the way a router reads them: a SUB socket and plain msgpack.

A burst stores the retained entries' full pages on "GPU"; filling the pool
demotes them (stored on "CPU", removed from "GPU"); without a tierd the same
pressure evicts them (removed from "GPU", stored nowhere). The replay socket
resends the batches a subscriber missed, and ends with sequence number -1.
"""

from __future__ import annotations

import time

import msgpack
import zmq

from ignis.engine.reuse.hashing import page_chain
from tests.engine.engine_process import EngineProcess
from tests.engine.test_tiers_e2e import Tierd, fill_pool, prompt

TOPIC = b"kv@test@ignis-demo"


class Subscriber:
    """A SUB socket on the engine's KV events; ``held`` is what each medium holds by the events seen."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.messages: list[tuple[int, bytes]] = []
        self.events: list[list] = []
        self.held: dict[str, set[int]] = {"GPU": set(), "CPU": set(), "DISK": set()}

    def _take(self, frames: list[bytes]) -> None:
        topic, seq, payload = frames
        assert topic == TOPIC
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0
        self.messages.append((int.from_bytes(seq, "big"), payload))
        for ev in events:
            self.events.append(ev)
            if ev[0] == "BlockStored":
                self.held[ev[6]].update(ev[1])
            elif ev[0] == "BlockRemoved":
                self.held[ev[2]].difference_update(ev[1])
            else:
                assert ev == ["AllBlocksCleared"]

    def wait_for(self, what, eng: EngineProcess, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, (self.held, self.events[-5:], eng.log_text())
            if self.sub.poll(100):
                self._take(self.sub.recv_multipart())

    def close(self) -> None:
        self.sub.close(0)


def blocks_of(tokens: list[int], pages: int) -> list[int]:
    """The block hashes of the first ``pages`` full pages: chain hashes, first 8 bytes big-endian, top bit clear."""
    return [int.from_bytes(h[:8], "big") & ((1 << 63) - 1) for h in page_chain(tokens, 64)[1:pages + 1]]


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """The batches from ``start`` on, asked as a REQ socket asks (empty delimiter, 8-byte sequence number)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert sock.poll(10_000), "replay did not answer"
            empty, seq, payload = sock.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(0)


def test_burst_demotion_and_replay(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    tierd = Tierd(rt, "--reuse-kv-host-pool-bytes", "32M", "--kv-disk-bytes", "0")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--reuse-host-slots-per-lane", "4", "--kv-events-endpoint", f"ipc://{rt}/kv.sock",
                        "--kv-events-replay-endpoint", f"ipc://{rt}/kv-replay.sock",
                        "--kv-events-topic", TOPIC.decode())
    sub = Subscriber(f"ipc://{rt}/kv.sock")
    try:
        eng.stats()  # a round trip: the subscription is in place before the first event
        p = prompt(300, 1)
        eng.run("a1", p, max_tokens=6, ignore_eos=True, system_end=200, opener_start=297)
        expected = blocks_of(p, 4)  # the checkpoint at 297 covers 4 full pages, the prefix at 200 three
        sub.wait_for(lambda: set(expected) <= sub.held["GPU"], eng)
        stored = [ev for ev in sub.events if ev[0] == "BlockStored"]
        first = stored[0]
        assert first[1] == blocks_of(p, 3) and first[2] is None and first[3] == p[:192] and first[4] == 64
        assert first[5] is None and first[6] == "GPU"
        second = next(ev for ev in stored if expected[3] in ev[1])
        assert second[2] == expected[2] and second[3] == p[192:256]  # only the page the prefix lacked

        fill_pool(eng, "fill")
        assert eng.stats()["reuse_demotions_total"] >= 1
        sub.wait_for(lambda: set(expected) <= sub.held["CPU"], eng)
        sub.wait_for(lambda: not set(expected) & sub.held["GPU"], eng)
        removed = [ev for ev in sub.events if ev[0] == "BlockRemoved" and ev[2] == "GPU"]
        assert set(expected) <= {h for ev in removed for h in ev[1]}

        seqs = [seq for seq, _ in sub.messages]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap
        assert replay(f"ipc://{rt}/kv-replay.sock", 1) == [m for m in sub.messages if m[0] >= 1]
        assert replay(f"ipc://{rt}/kv-replay.sock", seqs[-1] + 1) == []
    finally:
        sub.close()
        assert eng.stop() == 0
        assert tierd.stop() == 0


def test_eviction_without_a_tierd_removes_blocks(tmp_path):
    eng = EngineProcess(tmp_path, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--kv-events-endpoint", f"ipc://{tmp_path}/kv.sock", "--kv-events-topic", TOPIC.decode())
    sub = Subscriber(f"ipc://{tmp_path}/kv.sock")
    try:
        eng.stats()
        p = prompt(300, 2)
        eng.run("b1", p, max_tokens=4, ignore_eos=True, system_end=200, opener_start=297)
        expected = set(blocks_of(p, 4))
        sub.wait_for(lambda: expected <= sub.held["GPU"], eng)
        fill_pool(eng, "evict")
        assert eng.stats()["reuse_released_total"] >= 1
        sub.wait_for(lambda: not expected & sub.held["GPU"], eng)
        assert not sub.held["CPU"] and not sub.held["DISK"]
    finally:
        sub.close()
        assert eng.stop() == 0
