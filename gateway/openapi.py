"""GET /openapi.json: an OpenAPI 3.1 document of the routes the application serves.

Built from the application's router when first asked for (so it cannot miss a
route): one operation per method and path, summarized by the first line of its
handler's docstring, with the JSON Schemas of its body and answers from
``gateway.request_schemas`` (which states the parsers' own limits).
"""

from __future__ import annotations

import re

from aiohttp import web

from ignis.gateway.cache_reset import RESET_PATHS
from ignis.gateway.profiling_api import PROFILE_PATHS
from ignis.gateway.keyed_paths import needs_key
from ignis.gateway.messages_api import PATH_PREFIX as MESSAGES_PREFIX
from ignis.gateway.request_schemas import ANSWERS, ANTHROPIC_ERROR, ERROR, REQUESTS, SSE_EVENT, STREAMING
from ignis.gateway.responses import json_response
from ignis.gateway.state import STATE

OPENAPI_VERSION = "3.1.0"
_DOC = web.AppKey("ignis_openapi", tuple)  # (the model names it was made for, the document)


def _summary(handler) -> str:
    doc = (getattr(handler, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else getattr(handler, "__name__", "")


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _responses(method: str, path: str) -> dict:
    answer = ANSWERS.get((method, path))
    ok: dict = {"description": "OK"}
    if answer is not None:
        ok["content"] = _json(answer)
    if path in ("/metrics", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    if (method == "POST" and path in STREAMING) or (method, path) == ("GET", "/v1/responses/{response_id}"):
        # stream: true answers server-sent events (a background response's, for the GET); the schema is each event's
        ok.setdefault("content", {})["text/event-stream"] = {"schema": SSE_EVENT}
    out = {"200": ok}
    if path in PROFILE_PATHS:
        out["400"] = {"description": "the engine did not start or stop its profiler (profiling off, already "
                                     "profiling, not profiling)", "content": _json(ERROR)}
    if path in RESET_PATHS:
        out["409"] = {"description": "the engine holds requests: nothing was reset (code engine_busy)",
                      "content": _json(ERROR)}
    if path in ("/health", "/ping", "/health_generate"):
        out["503"] = {"description": "the engine is not answering (or, for /health_generate, generated no token "
                                     "in time; for /health, serves none of this gateway's models)",
                      "content": _json({"type": "object", "properties": {"status": {"const": "unavailable"}},
                                        "required": ["status"]})}
    elif path.startswith(MESSAGES_PREFIX):
        out["default"] = {"description": "an Anthropic error object", "content": _json(ANTHROPIC_ERROR)}
    else:
        out["default"] = {"description": "an OpenAI error object", "content": _json(ERROR)}
    return out


def _with_models(schema: dict | None, models: list[str] | None) -> dict:
    if schema is None:
        return {"type": "object"}
    if not models or "model" not in schema.get("properties", {}):
        return schema
    return {**schema, "properties": {**schema["properties"], "model": {"enum": list(models)}}}


def openapi_document(app: web.Application, title: str, version: str, models: list[str] | None = None) -> dict:
    """``models``: the names a body's ``model`` may take (any string when None)."""
    paths: dict[str, dict] = {}
    for route in app.router.routes():
        if route.method in ("HEAD", "OPTIONS", "*"):
            continue
        path = route.resource.canonical if route.resource is not None else ""
        op: dict = {"summary": _summary(route.handler), "responses": _responses(route.method, path)}
        params = re.findall(r"\{(\w+)\}", path)
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if route.method == "POST" and path not in RESET_PATHS + PROFILE_PATHS:  # those take no body
            op["requestBody"] = {"required": True, "content": _json(_with_models(REQUESTS.get(path), models))}
        elif route.method == "POST" and path in REQUESTS:  # an optional one
            op["requestBody"] = {"required": False, "content": _json(REQUESTS[path])}
        if needs_key(path):
            op["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[route.method.lower()] = op
    return {"openapi": OPENAPI_VERSION, "info": {"title": title, "version": version}, "paths": paths,
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


def package_version() -> str:
    """The installed ignis package's version ("0" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ignis")
    except PackageNotFoundError:
        return "0"


async def openapi(request: web.Request) -> web.Response:
    """This document."""
    gw = request.app[STATE]
    names = tuple(gw.names)  # adapters loaded or unloaded while serving change it
    cached = request.app.get(_DOC)
    if cached is None or cached[0] != names:
        cached = (names, openapi_document(request.app, "ignis", package_version(), list(names)))
        request.app[_DOC] = cached
    return json_response(cached[1])
