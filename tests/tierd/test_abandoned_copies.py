"""A copy that outlasts tierd's wait at the end of a session: the arena goes to no new session until it returns.

In-process: the server's loop is this test (its handlers called directly,
its replies taken from the channel). A copy job is held on an event past the
end of its session; a new engine's hello is refused as busy while it runs
(it could still write into the arena the new session would hand out), the
arena stays mapped, the job's outcome is dropped when it returns, a job
queued behind it never starts, and then the next hello is welcomed, or, with
no engine attached, the arena is released. A KV-disk write stalled in an I/O
thread is abandoned the same way: the session ends without waiting for it.
"""

from __future__ import annotations

import threading
import time

import pytest

import ignis.tierd.disk as kvdisk
import ignis.tierd.server as tierd_server
from ignis.shared.tier_wire import (TIER_PROTOCOL_VERSION, Bye, Demote, Detached, Hello, TierRefused, UnitLayout,
                                    Welcome)
from ignis.tierd.arena import Arena
from ignis.tierd.config import TierdConfig
from ignis.tierd.copier import Worker
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.server import TierServer
from tests.tierd.fake_engine import PAGE_BYTES, STAMP, key, make_blocks


class Loop:
    """A TierServer whose loop turns when the test says; its replies in ``sent``."""

    def __init__(self, tmp_path, monkeypatch):
        monkeypatch.setattr(tierd_server, "_STOP_WAIT_S", 0.1)
        join = Worker.close
        monkeypatch.setattr(Worker, "close", lambda self, timeout=0.5: join(self, timeout))  # a stalled job
        self.blocks = make_blocks()
        self.server = TierServer(TierdConfig(kv_disk_bytes=1 << 20), Arena(64 * PAGE_BYTES, lock="try"),
                                 f"ipc://{tmp_path}/tierd.sock", tmp_path / "kv", TierdMetrics("t"),
                                 mac_key=bytes(32))
        self.sent: list = []
        monkeypatch.setattr(self.server.channel, "send", lambda msg, peer: self.sent.append(msg))

    def hello(self, req: int, peer: bytes):
        self.server._hello(peer, Hello(req=req, protocol=TIER_PROTOCOL_VERSION, stamp=STAMP, family="qwen3_next",
                                       block_bytes=PAGE_BYTES,
                                       blocks=tuple(b.descriptor() for b in self.blocks.values()),
                                       unit=UnitLayout(), engine_id="default"))
        return self.sent[-1]

    def turn_until_returned(self) -> None:
        """Turn the loop until the abandoned copies have returned and been noticed."""
        deadline = time.monotonic() + 10
        while self.server._abandoned is not None and time.monotonic() < deadline:
            self.server._wake.wait(0.05)
            self.server._run_posted()  # a returned job's outcome: logged and dropped
            self.server._copies_left()  # as each turn of serve_forever does
        assert self.server._abandoned is None

    def close(self) -> None:
        if self.server.store is not None:
            self.server.store.close()
        self.server.channel.close()
        for b in self.blocks.values():
            b.close()


@pytest.fixture
def loop(tmp_path, monkeypatch):
    harness = Loop(tmp_path, monkeypatch)
    yield harness
    harness.close()


def test_an_abandoned_copy_keeps_the_arena_from_a_new_session(loop, caplog):
    release = threading.Event()
    caplog.set_level("WARNING", logger="ignis.tierd")
    try:
        assert isinstance(loop.hello(1, b"a"), Welcome)
        copier = loop.server.store.copier
        copier.submit(lambda: release.wait(30),
                      lambda r, err, s: pytest.fail("the outcome of an abandoned copy was handled"))
        queued = []
        copier.submit(lambda: queued.append("ran"), lambda r, err, s: pytest.fail("handled"))
        loop.server._bye(b"a", Bye(2))
        assert isinstance(loop.sent[-1], Detached)
        assert loop.server.arena.mapped, "released under a copy that may still write into it"

        refused = loop.hello(3, b"b")
        assert isinstance(refused, TierRefused) and refused.reason == "busy" and "abandoned" in refused.message
        assert loop.server.store is None

        release.set()
        loop.turn_until_returned()
        assert queued == [], "a copy queued behind the stalled one started after its session ended"
        assert caplog.text.count("abandoned when its session ended has returned") == 1  # the one that ran
        assert isinstance(loop.hello(4, b"b"), Welcome)
        assert loop.server.store is not None
    finally:
        release.set()


def test_with_no_engine_attached_the_arena_is_released_once_the_copy_returns(loop):
    release = threading.Event()
    try:
        assert isinstance(loop.hello(1, b"a"), Welcome)
        loop.server.store.copier.submit(lambda: release.wait(30), lambda r, err, s: None)
        loop.server._bye(b"a", Bye(2))
        assert loop.server.arena.mapped
        release.set()
        loop.turn_until_returned()
        assert not loop.server.arena.mapped
        assert isinstance(loop.hello(3, b"b"), Welcome)  # mapped again for the next engine
    finally:
        release.set()


def test_a_stalled_kv_disk_write_is_abandoned_without_stopping_the_loop(loop, monkeypatch):
    release = threading.Event()
    real_seal = kvdisk._seal

    def stalled_seal(*args, **kwargs):
        release.wait(30)  # the disk hangs inside an I/O thread
        return real_seal(*args, **kwargs)

    monkeypatch.setattr(kvdisk, "_seal", stalled_seal)
    try:
        assert isinstance(loop.hello(1, b"a"), Welcome)
        loop.server.handle(b"a", Demote(2, key(1), STAMP, (("kv", 1), ("kv", 2), ("ssm", 0), ("conv", 0)),
                                        target="disk"))
        bye = threading.Thread(target=loop.server._bye, args=(b"a", Bye(3)), daemon=True)
        bye.start()
        bye.join(10)  # the stalled write takes 30
        assert not bye.is_alive(), "the session's end waited for the stalled disk"
        assert loop.server._abandoned is not None
        assert isinstance(loop.hello(4, b"b"), TierRefused)
        release.set()
        loop.turn_until_returned()
        assert isinstance(loop.hello(5, b"b"), Welcome)
    finally:
        release.set()
