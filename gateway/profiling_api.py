"""vLLM's ``POST /start_profile`` and ``/stop_profile``: the engine's torch profiler over served rounds.

The engine takes them with ``--profile-dir DIR`` (``engine.profiling``); the
gateway forwards them (``Profile``) and answers what the engine did:

- start: 200 ``{"profiling": true}``; an optional body ``{"num_steps": N}``
  (SGLang's name) stops the profile by itself after N rounds;
- stop: 200 ``{"profiling": false, "trace": PATH, "summary": PATH,
  "message": ...}``, the files written on the engine's machine (after a
  profile that stopped by its round count, that profile's files);
- 400 naming why not (profiling off, already profiling, not profiling);
  503 when the engine does not answer.

Under the API key, like the cache resets; a POST may come without a body.
"""

from __future__ import annotations

from aiohttp import web

from ignis.gateway.body import parse_object, read_body
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.responses import json_response
from ignis.gateway.state import STATE, GatewayState
from ignis.shared.wire import MAX_PROFILE_ROUNDS

PROFILE_PATHS = ("/start_profile", "/stop_profile")
"""Paths outside /v1 that take the API key, and whose POST needs no JSON body."""
MAX_BODY = 4 << 10


async def start_profile(request: web.Request) -> web.Response:
    """Start the engine's profiler (vLLM's; ``num_steps``: SGLang's round count)."""
    gw: GatewayState = request.app[STATE]
    f = Fields({})
    if request.body_exists:
        f = Fields(parse_object(await read_body(request, MAX_BODY, gw.config.body_read_timeout)))
    rounds = f.int("num_steps", 0, 1, MAX_PROFILE_ROUNDS)
    answer = await gw.client.profile(True, rounds)
    if not answer.ok:
        raise invalid(f"the profiler was not started: {answer.message}", None)
    return json_response({"profiling": True})


async def stop_profile(request: web.Request) -> web.Response:
    """Stop the engine's profiler and name the files it wrote."""
    gw: GatewayState = request.app[STATE]
    answer = await gw.client.profile(False)
    if not answer.ok:
        raise invalid(f"the profiler was not stopped: {answer.message}", None)
    return json_response({"profiling": False, "trace": answer.trace, "summary": answer.summary,
                          "message": answer.message})
