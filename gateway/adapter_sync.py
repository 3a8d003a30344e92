"""The gateway's list of LoRA adapters follows the engine's, whoever changed it.

A gateway learns of the adapters it loads or unloads itself at once
(``gateway.lora_api``); with several gateways before one engine, or after the
engine restarted (forgetting what was loaded while serving), its list goes
stale. The engine's Stats carry ``lora_adapters_version``, which moves with
every load and unload; once a heartbeat shows a version other than the one
this gateway last saw, it asks the engine for the list (``ListAdapters``) and
takes it whole: ``/v1/models`` and the names requests may give follow within
about a second.
"""

from __future__ import annotations

import asyncio
import logging

from ignis.gateway.engine_client import HEARTBEAT_S, EngineUnavailable
from ignis.gateway.state import GatewayState

log = logging.getLogger("ignis.gateway")

VERSION = "lora_adapters_version"


async def sync_once(gw: GatewayState) -> bool:
    """Take the engine's list if its version moved; whether the list was taken."""
    version = gw.client.stats_values.get(VERSION)
    if type(version) is not int or version == gw.adapters_version:
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
    """``sync_once`` after each heartbeat, until cancelled."""
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        try:
            await sync_once(gw)
        except Exception:  # a bug here must not stop the loop that keeps the list right
            log.exception("LoRA adapter list sync failed")
