"""The gateway's list of LoRA adapters follows the engine's, whoever changed it.

A gateway learns of the adapters it loads or unloads itself at once
(``gateway.lora_api``); with several gateways before one engine, or after the
engine restarted (forgetting what was loaded while serving), its list goes
stale. The engine's Stats carry ``lora_adapters_version``, which moves with
every load and unload; once a heartbeat shows a version other than the one
this gateway last saw, it asks the engine for the list (``ListAdapters``) and
takes it whole: ``/v1/models`` and the names requests may give follow within
about a second. The first Stats of each engine instance (its
``engine_started_unix``) take the list whatever the version: a gateway
started with other ``--lora-modules`` than the engine's (units run apart, the
flag given to the engine only) or before an engine restarted with other flags
would otherwise keep a list the engine does not serve until a load or an
unload moved the version.
"""

from __future__ import annotations

import asyncio
import logging

from ignis.gateway.engine_client import HEARTBEAT_S, EngineUnavailable
from ignis.gateway.state import GatewayState

log = logging.getLogger("ignis.gateway")

VERSION = "lora_adapters_version"
STARTED = "engine_started_unix"


async def sync_once(gw: GatewayState, force: bool = False) -> bool:
    """Take the engine's list if its version moved (``force``: whatever its version); whether it was taken."""
    version = gw.client.stats_values.get(VERSION)
    if type(version) is not int or (version == gw.adapters_version and not force):
        return False
    try:
        answer = await gw.client.list_adapters()
    except EngineUnavailable:
        return False
    taken = dict(zip(answer.names, answer.paths))
    if taken != gw.adapters:
        log.info("LoRA adapters now served (engine's list, version %d): %s", answer.version,
                 ", ".join(taken) or "none")
    gw.adapters.clear()  # in place: every selected view of the state shares the dict
    gw.adapters.update(taken)
    gw.adapters_version = answer.version
    return True


async def keep_adapters(gw: GatewayState) -> None:
    """``sync_once`` after each heartbeat, until cancelled; forced once for each engine instance."""
    taken_from = None  # the engine instance (its start time) whose list was last taken
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        try:
            started = gw.client.stats_values.get(STARTED)
            if await sync_once(gw, force=started is not None and started != taken_from):
                taken_from = started
        except Exception:  # a bug here must not stop the loop that keeps the list right
            log.exception("LoRA adapter list sync failed")
