"""vLLM's ``POST /reset_prefix_cache`` and SGLang's ``/flush_cache``: drop every retained entry in every tier.

Benchmarks call them between runs so that each run starts cold, and an
operator after changing what prompts hold. Both ask the engine
(``FlushCache``, ``engine.cache_flushes``) and answer what it did:

- 200 ``{"flushed": true, "retained_entries": N}``: every retained entry is
  gone, on the device, in KV-RAM and on KV-disk, and what the engine learned
  of recent prompts with them; the next request meets a fresh engine;
- 409 (code ``engine_busy``): the engine holds requests (running, waiting,
  or moved down a tier), and resets only when idle, as vLLM's and SGLang's
  do; nothing was dropped; retry when it is idle;
- 503: the engine does not answer.

Under the API key like the ``/v1`` routes. A POST may come without a body
(as both servers' clients send it) and a body is ignored; SGLang's
``/flush_cache`` is also answered on GET. vLLM's ``reset_running_requests``
query is not taken: running requests are never preempted for a reset.
"""

from __future__ import annotations

from aiohttp import web

from ignis.gateway.errors import ApiError
from ignis.gateway.responses import json_response
from ignis.gateway.state import STATE, GatewayState

RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")
"""Paths outside /v1 that take the API key, and whose POST needs no JSON body."""


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Drop every retained entry in every tier, once the engine is idle (vLLM's; SGLang's /flush_cache)."""
    gw: GatewayState = request.app[STATE]
    answer = await gw.client.flush_cache()
    if not answer.flushed:
        raise ApiError(409, f"the prefix cache was not reset: {answer.message}; retry when the engine is idle",
                       code="engine_busy")
    return json_response({"flushed": True, "retained_entries": answer.entries})
