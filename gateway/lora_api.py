"""vLLM's ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, with ``--enable-lora-updating``.

``{"lora_name": NAME, "lora_path": DIR}`` loads a PEFT adapter as NAME for the
default model (``engine.lora_updates``); with ``"load_inplace": true`` (vLLM's;
a JSON boolean, else a 400) an adapter already served as NAME has its weights
replaced by the files at DIR (checked as any load; none served: a plain
load); ``{"lora_name": NAME}`` unloads one.
Answers, as vLLM's: 200 with a plain-text ``Success: ...`` line; a 400 naming
the reason (the adapter refused, its name taken, the default model not
loaded, the adapter still in use); a 404 for unloading an adapter that is not
served. On success the gateway's list of adapters (``/v1/models``, the names
requests may give) follows at once. Without the flag the routes are not
served (404).

A name to load is 1 to ``MAX_NAME`` printable ASCII characters without
spaces, as a request id is (else a 400): it reaches the engine's log and
every gateway's model list. An unload takes any name, since only a served
one matches.
"""

from __future__ import annotations

import re

from aiohttp import web

from ignis.gateway.body import parse_object, read_body
from ignis.gateway.errors import ApiError, invalid
from ignis.gateway.fields import Fields
from ignis.gateway.state import STATE, GatewayState
from ignis.shared.wire import MAX_ID_CHARS as MAX_NAME
from ignis.shared.wire import MAX_PATH_CHARS as MAX_PATH
from ignis.shared.wire import LoadAdapter, UnloadAdapter

MAX_BODY = 64 << 10
_LOADABLE_NAME = re.compile(r"[!-~]{1,%d}" % MAX_NAME)


async def _fields(request: web.Request) -> Fields:
    gw: GatewayState = request.app[STATE]
    raw = await read_body(request, MAX_BODY, gw.config.body_read_timeout)
    return Fields(parse_object(raw))


def _name(f: Fields) -> str:
    name = f.str("lora_name", None, max_chars=MAX_NAME)
    if not name:
        raise invalid("lora_name is required: a non-empty string", "lora_name")
    return name


def _answer(answer, done: str) -> web.Response:
    if answer.ok:
        return web.Response(text=f"Success: {done}", content_type="text/plain")
    if answer.missing:
        raise ApiError(404, answer.message, param="lora_name", code="not_found")
    raise invalid(answer.message, "lora_name")


async def load_lora_adapter(request: web.Request) -> web.Response:
    """Load a LoRA adapter for the default model while serving (vLLM's)."""
    gw: GatewayState = request.app[STATE]
    f = await _fields(request)
    name = _name(f)
    if not _LOADABLE_NAME.fullmatch(name):
        raise invalid(f"lora_name must be 1 to {MAX_NAME} printable ASCII characters without spaces", "lora_name")
    path = f.str("lora_path", None, max_chars=MAX_PATH)
    if not path:
        raise invalid("lora_path is required: the adapter's directory", "lora_path")
    inplace = f.bool("load_inplace")
    if name in gw.aliases:  # the engine knows the model by its first name only
        raise invalid(f"the name {name!r} is taken: it names the model {gw.aliases[name]!r}", "lora_name")
    answer = await gw.client.update_adapter(LoadAdapter, name, path, True if inplace else None)
    if answer.ok:
        gw.adapters[name] = path
    return _answer(answer, f"LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """Unload a LoRA adapter while serving (vLLM's)."""
    gw: GatewayState = request.app[STATE]
    name = _name(await _fields(request))
    answer = await gw.client.update_adapter(UnloadAdapter, name)
    if answer.ok or answer.missing:
        gw.adapters.pop(name, None)
    return _answer(answer, f"LoRA adapter '{name}' removed successfully.")
