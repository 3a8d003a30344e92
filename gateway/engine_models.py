"""Whether the engine serves the models this gateway asks it for.

A gateway started apart from its engine (by hand, or by systemd units whose
argument files disagree) may name models the engine does not serve: every
request for them is then refused by the engine (404), while ``/health``
looked fine. The engine's Stats say which names it serves; after each
heartbeat the gateway compares them with its own (``--model``,
``--served-model-name``) and logs an ERROR naming the difference and the flags
to fix, once per difference (and an INFO once they agree again). ``/health``
answers 503 while the engine serves none of them.
"""

from __future__ import annotations

import asyncio
import logging

from ignis.gateway.engine_client import HEARTBEAT_S
from ignis.gateway.state import GatewayState

log = logging.getLogger("ignis.gateway")


def not_served(gw: GatewayState) -> list[str]:
    """Those of ``served_list`` (the names requests carry to the engine; adapters run the default) the engine
    does not serve (none until the engine has said what it serves)."""
    served = gw.client.engine_models
    return [name for name in gw.served_list if served and name not in served]


def serves_none(gw: GatewayState) -> bool:
    """The engine said what it serves, and it is none of this gateway's models: no request can be served."""
    missing = not_served(gw)
    return bool(missing) and len(missing) == len(gw.served_list)


class ModelCheck:
    """Logs each new disagreement between the gateway's models and the engine's, and its end."""

    def __init__(self, gw: GatewayState):
        self.gw = gw
        self.reported: tuple[str, ...] = ()

    def once(self) -> None:
        missing = tuple(not_served(self.gw))
        if missing == self.reported:
            return
        if missing:
            log.error("the engine serves %s, not %s, which this gateway asks for: requests for %s are refused "
                      "(404); give the gateway the engine's --model and --served-model-name",
                      ", ".join(self.gw.client.engine_models), ", ".join(missing),
                      "them" if len(missing) > 1 else "it")
        else:
            log.info("the engine serves every model this gateway asks for again")
        self.reported = missing


async def watch_models(gw: GatewayState) -> None:
    """``ModelCheck.once`` after each heartbeat, until cancelled."""
    check = ModelCheck(gw)
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        try:
            check.once()
        except Exception:  # a bug here must not stop the check
            log.exception("checking the engine's models failed")
