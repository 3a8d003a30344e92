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
