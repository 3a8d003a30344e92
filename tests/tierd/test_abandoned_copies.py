"""A copy that outlasts tierd's wait at the end of a session: the arena goes to no new session until it returns.

In-process: the server's loop is this test (its handlers called directly,
its replies taken from the channel). A copy job is held on an event past the
end of its session; a new engine's hello is refused as busy while it runs
(it could still write into the arena the new session would hand out), the
arena stays mapped, the job's outcome is dropped when it returns, and the
next hello is welcomed.
"""

from __future__ import annotations

import threading
import time

import pytest

import ignis.tierd.server as tierd_server
from ignis.shared.tier_wire import TIER_PROTOCOL_VERSION, Bye, Detached, Hello, TierRefused, UnitLayout, Welcome
from ignis.tierd.arena import Arena
from ignis.tierd.config import TierdConfig
from ignis.tierd.metrics import TierdMetrics
from ignis.tierd.server import TierServer
from tests.tierd.fake_engine import PAGE_BYTES, STAMP, make_blocks


def test_an_abandoned_copy_keeps_the_arena_from_a_new_session(tmp_path, monkeypatch):
    monkeypatch.setattr(tierd_server, "_STOP_WAIT_S", 0.1)
    blocks = make_blocks()
    server = TierServer(TierdConfig(kv_disk_bytes=1 << 20), Arena(64 * PAGE_BYTES, lock="try"),
                        f"ipc://{tmp_path}/tierd.sock", tmp_path / "kv", TierdMetrics("t"), mac_key=bytes(32))
    sent: list = []
    monkeypatch.setattr(server.channel, "send", lambda msg, peer: sent.append(msg))
    release = threading.Event()
    try:
        def hello(req: int, peer: bytes):
            server._hello(peer, Hello(req=req, protocol=TIER_PROTOCOL_VERSION, stamp=STAMP, family="qwen3_next",
                                      block_bytes=PAGE_BYTES, blocks=tuple(b.descriptor() for b in blocks.values()),
                                      unit=UnitLayout(), engine_id="default"))
            return sent[-1]

        assert isinstance(hello(1, b"a"), Welcome)
        server.store.copier.submit(lambda: release.wait(30),
                                   lambda r, err, s: pytest.fail("the outcome of an abandoned copy was handled"))
        server._bye(b"a", Bye(2))
        assert isinstance(sent[-1], Detached)
        assert server.arena.mapped, "released under a copy that may still write into it"

        refused = hello(3, b"b")
        assert isinstance(refused, TierRefused) and refused.reason == "busy" and "abandoned" in refused.message
        assert server.store is None

        release.set()
        deadline = time.monotonic() + 10
        while server._abandoned.copies_running and time.monotonic() < deadline:
            server._wake.wait(0.05)
        server._run_posted()  # the returned job's outcome: logged and dropped
        assert isinstance(hello(4, b"b"), Welcome)
        assert server._abandoned is None and server.store is not None
    finally:
        release.set()
        if server.store is not None:
            server.store.close()
        server.channel.close()
        for b in blocks.values():
            b.close()
