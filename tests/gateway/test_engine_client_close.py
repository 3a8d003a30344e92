"""EngineClient.close: everything closes even when one of its tasks had failed (an open socket would hold the
context's end, and with it the gateway's exit)."""

from __future__ import annotations

import asyncio

from ignis.gateway.engine_client import EngineClient


def test_close_ends_the_socket_and_context_when_the_reader_had_failed(tmp_path, caplog):
    async def scenario():
        client = EngineClient(f"ipc://{tmp_path}/nobody.sock")
        await client.start()
        client._reader.cancel()

        async def failed():
            raise RuntimeError("a reader that broke")

        client._reader = asyncio.ensure_future(failed())
        await asyncio.sleep(0)  # it runs and fails
        await asyncio.wait_for(client.close(), 10)
        return client

    client = asyncio.run(scenario())
    assert client._sock.closed and client._ctx.closed
    assert "the engine connection's reader had failed" in caplog.text


def test_a_cancel_that_arrives_as_the_stats_answer_does_still_ends_the_heartbeat(tmp_path):
    """The heartbeat's Stats answer and close's cancel in the same loop turn: the cancel is not lost (3.11's
    ``asyncio.wait_for`` returned the answer and dropped it, and close then waited on the heartbeat forever)."""
    async def scenario():
        client = EngineClient(f"ipc://{tmp_path}/nobody.sock")
        await client.start()
        for _ in range(50):  # the heartbeat is waiting for a Stats answer
            if client._stats_waiters:
                break
            await asyncio.sleep(0.01)
        waiter = client._stats_waiters[0]
        waiter.set_result({"max_model_len": 1})  # the answer arrives ...
        client._heartbeat.cancel()  # ... as the cancel does
        done, _ = await asyncio.wait({client._heartbeat}, timeout=3)
        await asyncio.wait_for(client.close(), 10)
        return done

    assert asyncio.run(scenario()), "the heartbeat lost its cancel and went on"
