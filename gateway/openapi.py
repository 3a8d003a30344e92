"""GET /openapi.json: an OpenAPI 3.1 document of the routes the application serves.

Built from the application's router when first asked for (so it cannot miss a
route): one operation per method and path, summarized by the first line of its
handler's docstring. Request and response schemas are OpenAI's (docs/api.md);
the document names the routes and their JSON bodies, not every field.
"""

from __future__ import annotations

import re

from aiohttp import web

from ignis.gateway.responses import json_response

OPENAPI_VERSION = "3.1.0"
_DOC = web.AppKey("ignis_openapi", dict)


def _summary(handler) -> str:
    doc = (getattr(handler, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else getattr(handler, "__name__", "")


def openapi_document(app: web.Application, title: str, version: str) -> dict:
    paths: dict[str, dict] = {}
    for route in app.router.routes():
        if route.method in ("HEAD", "OPTIONS", "*"):
            continue
        path = route.resource.canonical if route.resource is not None else ""
        op: dict = {"summary": _summary(route.handler),
                    "responses": {"200": {"description": "OK"}, "default": {"description": "an OpenAI error object"}}}
        params = re.findall(r"\{(\w+)\}", path)
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if route.method == "POST":
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
            op["responses"]["200"]["content"] = {"application/json": {"schema": {"type": "object"}},
                                                 "text/event-stream": {"schema": {"type": "string"}}}
        if path.startswith("/v1"):
            op["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[route.method.lower()] = op
    return {"openapi": OPENAPI_VERSION, "info": {"title": title, "version": version}, "paths": paths,
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


async def openapi(request: web.Request) -> web.Response:
    """This document."""
    doc = request.app.get(_DOC)
    if doc is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("ignis")
        except PackageNotFoundError:
            ours = "0"
        doc = openapi_document(request.app, "ignis", ours)
        request.app[_DOC] = doc
    return json_response(doc)
