"""The aiohttp application: routes, the auth / error / metrics middleware, start and stop.

Routes:
    POST /v1/chat/completions   gateway.chat
    POST /v1/completions        gateway.completions
    POST /v1/responses          gateway.responses_api (GET / DELETE /v1/responses/{id}: stored ones;
                                POST /v1/responses/{id}/cancel: background ones;
                                GET /v1/responses/{id}/input_items: their input items)
    GET  /v1/models[/{id}]      the served model, OpenAI list format
    GET  /health                200 when the engine answers a Stats within 1 s, else 503 (no auth)
    GET  /metrics               the gateway's Prometheus metrics (no auth)
    GET  /openapi.json          the routes as an OpenAPI document (no auth; gateway.openapi)
    POST /v1/messages           Anthropic's Messages API (gateway.messages_api; also /v1/messages/count_tokens)
    POST /tokenize, /detokenize vLLM's token utilities (gateway.tokenize_api)
    POST /reset_prefix_cache    vLLM's cache reset (also /flush_cache, SGLang's, POST or GET; gateway.cache_reset)
    POST /start_profile         vLLM's profiler control, and /stop_profile (gateway.profiling_api)
    POST /v1/load_lora_adapter  with --enable-lora-updating, and /v1/unload_lora_adapter (gateway.lora_api)
    GET  /ping                  /health's check under vLLM's and SageMaker's name (POST too; no auth)
    GET  /version               the ignis version
    GET  /tokenizer_info        with --enable-tokenizer-info-endpoint (gateway.tokenize_api)
    vLLM's and SGLang's info routes (/load, /get_load, /is_sleeping, /get_model_info, /get_server_info,
    /server_info, /health_generate) and POST /invocations (SageMaker's): gateway.server_info

The middleware turns every failure into an OpenAI error object: ``ApiError``
as itself, aiohttp's HTTP errors (no route, method, body too large) mapped,
anything else a 500 whose body says only "internal error" and a request id
(also in ``X-Request-Id``; the log line with the trace names it). Before any
handler runs: CORS preflights are answered (gateway.cors), every /v1 path and
the routes that generate, read settings or change state (``gateway.keyed_paths``: /tokenize, /detokenize,
/tokenizer_info, /invocations, /server_info, /get_server_info, the cache resets, the profiler) need
``Authorization: Bearer <key>`` or ``x-api-key`` when a key is set (either may carry it; compared in constant time),
and a POST must be ``Content-Type: application/json`` (else 415, so a web page
cannot send one without a preflight), except a cache reset's, a profiler's or
a response cancel's POST without a body.
"""

from __future__ import annotations

import asyncio
import functools
import datetime
import hmac
import logging
import secrets
import time

import orjson
from aiohttp import web

from ignis.gateway import grammars
from ignis.gateway.adapter_sync import keep_adapters
from ignis.gateway.engine_models import serves_none, watch_models
from ignis.gateway.cache_reset import RESET_PATHS, reset_prefix_cache
from ignis.gateway.chat import chat_completions
from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.completions import completions
from ignis.gateway.config import GatewayConfig
from ignis.gateway.cors import add_origin_headers, is_preflight, preflight
from ignis.gateway.engine_client import EngineClient, EngineUnavailable
from ignis.gateway.errors import ApiError, from_http_exception
from ignis.gateway.expect_continue import expect_continue
from ignis.gateway.generation import ClientGone, EngineFailed, api_error_of
from ignis.gateway.listener import CONNECTIONS, Connections
from ignis.gateway.lora_api import load_lora_adapter, unload_lora_adapter
from ignis.gateway.messages_api import PATH_PREFIX as MESSAGES_PREFIX
from ignis.gateway.messages_api import REQUEST_ID as MESSAGES_REQUEST_ID
from ignis.gateway.messages_api import count_tokens, create_message
from ignis.gateway.metrics import GatewayMetrics
from ignis.gateway.keyed_paths import needs_key
from ignis.gateway.openapi import openapi, package_version
from ignis.gateway.profiling_api import PROFILE_PATHS, start_profile, stop_profile
from ignis.gateway.prompt_work import PROMPT_WORK, PromptWork
from ignis.gateway.request_ids import HEADER as REQUEST_ID_HEADER
from ignis.gateway.request_ids import echo_header
from ignis.gateway.responses_api import (
    RESPONSES,
    cancel_response,
    create_response,
    delete_response,
    get_response,
    list_input_items,
    responses_state,
    stop_background,
)
from ignis.gateway.responses import json_response
from ignis.gateway.sampling_defaults import parse_override, sampling_defaults
from ignis.gateway.server_info import add_routes as add_server_info_routes
from ignis.gateway.state import STATE, GatewayState, has_think_tokens
from ignis.gateway.stream_writer import STALLED
from ignis.gateway.image_decode import set_source_limit
from ignis.gateway.tokenize_api import detokenize, tokenize, tokenizer_info
from ignis.gateway.tokenizer import ModelFiles
from ignis.shared.api_key import keys_of
from ignis.shared.model_names import lora_specs, model_aliases
from ignis.shared.runtime import default_runtime_dir

log = logging.getLogger("ignis.gateway")
ADAPTER_SYNC = web.AppKey("ignis_adapter_sync", asyncio.Task)
MODEL_WATCH = web.AppKey("ignis_model_watch", asyncio.Task)
BODYLESS_PATHS = RESET_PATHS + PROFILE_PATHS
"""Keyed paths outside /v1 whose POST may come without a body."""

BODY_CEILING = 64 << 20
_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
              "/v1/models": "models", "/health": "health", "/metrics": "metrics", "/openapi.json": "openapi",
              "/tokenize": "tokenize", "/detokenize": "detokenize", "/v1/messages": "messages",
              "/v1/messages/count_tokens": "messages", "/reset_prefix_cache": "cache_reset",
              "/start_profile": "profile", "/stop_profile": "profile",
              "/flush_cache": "cache_reset"}


def _endpoint(request: web.Request) -> str:
    path = request.path
    if path.startswith("/v1/models/"):
        return "models"
    if path.startswith("/v1/responses/"):
        return "responses"
    return _ENDPOINTS.get(path, "other")


def _anthropic(request: web.Request) -> bool:
    """Whether the request is on Anthropic's Messages API, whose errors have Anthropic's shape."""
    return request.path == MESSAGES_PREFIX or request.path.startswith(MESSAGES_PREFIX + "/")


def _anthropic_id(request: web.Request) -> str:
    """A Messages request's id (its handler's, or one made here for an answer before it ran)."""
    if MESSAGES_REQUEST_ID not in request:
        request[MESSAGES_REQUEST_ID] = f"req_{secrets.token_hex(12)}"
    return request[MESSAGES_REQUEST_ID]


def _error(request: web.Request, err: ApiError) -> web.Response:
    """``err`` answered; on the Messages routes in Anthropic's shape, with the request's id at the top level
    (``request_id``, as Anthropic's bodies carry it; the same id is the ``request-id`` header)."""
    if not _anthropic(request):
        return err.response()
    resp = err.response(True)
    rid = resp.headers.get(REQUEST_ID_HEADER) or _anthropic_id(request)
    resp.body = orjson.dumps(dict(err.anthropic_body(), request_id=rid))
    return resp


async def _anthropic_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer on the Messages routes carries Anthropic's ``request-id`` header
    (the ``X-Request-Id`` one, which it gets too when it had none)."""
    if _anthropic(request):
        rid = response.headers.get(REQUEST_ID_HEADER) or _anthropic_id(request)
        response.headers.setdefault(REQUEST_ID_HEADER, rid)
        response.headers["request-id"] = rid


def _auth(gw: GatewayState, request: web.Request) -> None:
    key = gw.config.api_key
    if key is None or not needs_key(request.path):
        return
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    given = [k.strip() for k in (bearer if scheme.lower() == "bearer" else "",
                                 request.headers.get("x-api-key", "")) if k.strip()]  # Anthropic's clients: x-api-key
    if not given:
        how = "'x-api-key: <key>'" if _anthropic(request) else "'Authorization: Bearer <key>'"
        raise ApiError(401, f"missing API key: send {how}", code="invalid_api_key")
    # either header may carry it (a client may send both, one of them stale); each compared in constant time
    # a header's bytes that are not UTF-8 come as surrogates: compared as the bytes sent (never a match)
    if not any([hmac.compare_digest(k.encode("utf-8", "surrogateescape"), want.encode())
                for k in given for want in keys_of(key)]):
        raise ApiError(401, "incorrect API key", code="invalid_api_key")


def _bodyless(path: str) -> bool:
    """Whether a POST to ``path`` may come without a body (and so without a content type)."""
    return path in BODYLESS_PATHS or path == "/ping" or (path.startswith("/v1/responses/")
                                                         and path.endswith("/cancel"))


def _json_post(request: web.Request) -> None:
    if request.method == "POST" and request.content_type != "application/json" and not (
            _bodyless(request.path) and not request.body_exists):
        raise ApiError(415, f"POST bodies must be sent as Content-Type: application/json, got "
                            f"{request.content_type!r}", code="unsupported_media_type")


def _internal_error(request: web.Request) -> web.Response:
    rid = secrets.token_hex(8)
    # the path as a repr: a client's decoded path may hold newlines or escape codes
    log.exception("internal error, request id %s, on %s %r", rid, request.method, request.path)
    return _error(request, ApiError(500, f"internal error (request id {rid})", type="internal_error",
                                    headers={"X-Request-Id": rid}))


@web.middleware
async def _middleware(request: web.Request, handler):
    gw: GatewayState = request.app[STATE]
    connections: Connections = request.app[CONNECTIONS]
    connections.request_started(request)
    started = time.monotonic()
    status = 500
    try:
        if is_preflight(request):
            resp = preflight(request, gw.config.allowed_origins)
            status = resp.status
            return resp
        _auth(gw, request)
        _json_post(request)
        resp = await handler(request)
        status = 499 if resp.get(STALLED) else resp.status  # a stalled client's: dropped, not answered
        return resp
    except ApiError as e:
        status = e.status
        return _error(request, e)
    except web.HTTPException as e:
        err = from_http_exception(e)
        status = err.status
        return _error(request, err)
    except (EngineFailed, EngineUnavailable) as e:
        err = api_error_of(e)
        status = err.status
        return _error(request, err)
    except (ClientGone, ConnectionResetError):
        # the client went away mid-answer: nothing can be sent, and nothing is wrong here (raised on, aiohttp
        # would log an unhandled error with its traceback); this reply's write fails quietly in aiohttp. An
        # answer already under way is cut instead: never a second status line inside its body
        status = 499
        if request.transport is not None and getattr(request.writer, "output_size", 0):
            request.transport.abort()
        resp = web.Response(status=499)
        resp.force_close()
        return resp
    except asyncio.CancelledError:
        status = 499  # the client went away; nothing can be sent
        raise
    except Exception:
        return _internal_error(request)
    finally:
        connections.request_done(request)
        gw.metrics.observe(_endpoint(request), status, time.monotonic() - started)


async def health(request: web.Request) -> web.Response:
    """200 when the engine answers and serves a model this gateway asks for, else 503."""
    gw: GatewayState = request.app[STATE]
    try:
        await gw.client.stats(timeout=1.0)
    except EngineUnavailable:
        return json_response({"status": "unavailable", "engine": "not answering"}, status=503)
    if serves_none(gw):
        return json_response({"status": "unavailable", "engine": "serves other models: "
                              + ", ".join(gw.client.engine_models)}, status=503)
    return json_response({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    """The server's version."""
    return json_response({"version": package_version()})


async def metrics(request: web.Request) -> web.Response:
    """The gateway's Prometheus metrics."""
    gw: GatewayState = request.app[STATE]
    gw.metrics.wire_errors.sync(gw.client.garbage_count, "engine")
    connections = request.app.get(CONNECTIONS)
    if connections is not None:
        gw.metrics.sync_connections(connections.open - connections.closing, connections.refused,
                                    connections.displaced)
    return web.Response(body=gw.metrics.render(), headers={"Content-Type": gw.metrics.content_type})


def _model_card(gw: GatewayState, name: str) -> dict:
    """OpenAI's model object of ``name`` (``gw`` is the state it selects), with the keys of Anthropic's
    (``type``, ``display_name``, ``created_at``) so either API's clients read it."""
    created_at = datetime.datetime.fromtimestamp(gw.created, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    card = {"id": name, "object": "model", "created": gw.created, "owned_by": "ignis",
            "type": "model", "display_name": name, "created_at": created_at}
    if gw.adapter is not None:  # a LoRA adapter, as vLLM lists one: its directory and its base model
        card.update(root=gw.adapters[gw.adapter], parent=gw.base_model)
    values = gw.client.stats_values
    own = values.get(f"max_model_len_{gw.engine_index}")  # each model's, from an engine that says them
    loaded = int(values.get("model_index", 0))
    if own is not None:
        card["max_model_len"] = int(own)
    elif "max_model_len" in values and gw.served_list[loaded] == gw.engine_model:
        card["max_model_len"] = int(values["max_model_len"])
    return card


async def list_models(request: web.Request) -> web.Response:
    """The served models."""
    gw: GatewayState = request.app[STATE]
    cards = [_model_card(gw.select(n), n) for n in gw.names]
    # Anthropic's page keys beside OpenAI's list: every model fits one page
    return json_response({"object": "list", "data": cards, "has_more": False, "first_id": cards[0]["id"],
                          "last_id": cards[-1]["id"]})


async def get_model(request: web.Request) -> web.Response:
    """One served model."""
    gw: GatewayState = request.app[STATE]
    name = request.match_info["model"]
    return json_response(_model_card(gw.select(name), name))


def _template(files: ModelFiles, content_format: str = "auto"):
    if not files.chat_template:
        return None
    template = ChatTemplate(files.chat_template, files.tokenizer.special_tokens_map(), content_format)
    if not template.reads_tools:
        log.warning("the chat template never reads `tools`: a request's tools do not reach the prompt, so the "
                    "model is not told of them (serve a template that renders them, --chat-template)")
    return template


def _vision(files: ModelFiles, config: GatewayConfig):
    """The model's vision settings within the flags' pixel bounds (None: it takes no images)."""
    if files.vision is None or config.language_model_only:
        return None
    return files.vision.bounded(config.min_image_pixels, config.max_image_pixels)


def build_app(config: GatewayConfig, files: ModelFiles, model_name: str, endpoint: str,
              more_models: dict | None = None) -> web.Application:
    """The application, its state built; the engine connection opens on startup.
    ``more_models``: name -> ModelFiles of further configured models (the first is ``model_name``)."""
    if config.reasoning_parser not in ("auto", "off") and not has_think_tokens(files.tokenizer):
        raise ValueError(f"--reasoning-parser {config.reasoning_parser}: {model_name}'s tokenizer has no <think> "
                         f"and </think> tokens (auto or off serve it)")
    template = _template(files, config.chat_template_content_format)
    vision = _vision(files, config)
    override = parse_override(config.override_generation_config)
    defaults = sampling_defaults(config.generation_config, files.generation_config, override, model_name)
    models = {model_name: (files.tokenizer, template, vision, defaults)}
    for name, other in (more_models or {}).items():
        source = "vllm" if config.generation_config == "vllm" else "auto"  # a directory is the default model's
        models[name] = (other.tokenizer, _template(other, config.chat_template_content_format),
                        _vision(other, config),
                        sampling_defaults(source, other.generation_config, override, name))
    for name, (_, tpl, _, d) in models.items():
        if tpl is not None and tpl.joins_parts:  # said once: a message's parts reach this template as one string
            log.info("the chat template of %s reads a message's content as a string: text parts are joined by "
                     "newlines for it (--chat-template-content-format %s)", name, config.chat_template_content_format)
        if d.values:
            log.info("sampling defaults of %s from %s: %s (a request's own values win; --generation-config vllm "
                     "turns them off)", name, d.source, d.describe())
    if grammars.MISSING:
        log.warning("%s: constrained output (response_format json_schema/json_object, structured_outputs) is "
                    "refused with a 400, and tool calls a grammar would hold (tool_choice required or named, "
                    "strict tools, allowed_tools) are served unheld", grammars.MISSING)
    set_source_limit(config.max_image_source_pixels)
    files.tokenizer.longest_token_chars  # read once here, not in the first request (a vocabulary walk)
    aliases = {alias: model_name for alias in model_aliases(config.model, config.served_model_name)}
    adapters = dict(lora_specs(config.lora_modules, list(models) + list(aliases)))
    gw = GatewayState(config=config, model_name=model_name, tokenizer=files.tokenizer, template=template,
                      client=EngineClient(endpoint, timeout=config.engine_timeout),
                      metrics=GatewayMetrics(model_name), created=int(time.time()), models=models, vision=vision,
                      aliases=aliases, adapters=adapters, sampling_defaults=defaults)
    # Handlers read bodies through gateway.body, within RequestLimits; aiohttp's own limit is only a ceiling.
    app = web.Application(middlewares=[_middleware], client_max_size=config.max_request_bytes or BODY_CEILING)
    app[STATE] = gw
    app[PROMPT_WORK] = PromptWork()
    app[CONNECTIONS] = Connections(config.max_connections, config.header_read_timeout)
    app[RESPONSES] = responses_state(config.runtime_dir or default_runtime_dir(), config.instance)
    # every route answers an Expect header itself: a declared body past the limit is a 413 before it is sent,
    # and an expectation that is not 100-continue a 417 in the API's shape (aiohttp's own handler echoes it)
    expect = expect_continue(_error)
    get = functools.partial(app.router.add_get, expect_handler=expect)
    post = functools.partial(app.router.add_post, expect_handler=expect)
    delete = functools.partial(app.router.add_delete, expect_handler=expect)
    post("/v1/chat/completions", chat_completions)
    post("/v1/completions", completions)
    post("/v1/responses", create_response)
    get("/v1/responses/{response_id}", get_response)
    delete("/v1/responses/{response_id}", delete_response)
    post("/v1/responses/{response_id}/cancel", cancel_response)
    get("/v1/responses/{response_id}/input_items", list_input_items)
    get("/v1/models", list_models)
    get("/v1/models/{model:.+}", get_model)  # a name may hold slashes (a repo id)
    get("/health", health)
    get("/ping", health)  # vLLM's (and SageMaker's) name for the same check
    add_server_info_routes(app, health, expect)  # vLLM's and SGLang's operational routes (gateway.server_info)
    get("/version", version)
    get("/metrics", metrics)
    get("/openapi.json", openapi)
    post(MESSAGES_PREFIX, create_message)
    post(MESSAGES_PREFIX + "/count_tokens", count_tokens)
    post("/tokenize", tokenize)
    post("/detokenize", detokenize)
    post("/reset_prefix_cache", reset_prefix_cache)
    post("/flush_cache", reset_prefix_cache)
    get("/flush_cache", reset_prefix_cache, allow_head=False)  # a HEAD must not flush
    post("/start_profile", start_profile)
    post("/stop_profile", stop_profile)
    if config.enable_tokenizer_info_endpoint:
        get("/tokenizer_info", tokenizer_info)
    if config.enable_lora_updating:
        post("/v1/load_lora_adapter", load_lora_adapter)
        post("/v1/unload_lora_adapter", unload_lora_adapter)

    async def start(app: web.Application) -> None:
        await gw.client.start()
        app[ADAPTER_SYNC] = asyncio.create_task(keep_adapters(gw))
        app[MODEL_WATCH] = asyncio.create_task(watch_models(gw))

    async def finish_background(app: web.Application) -> None:
        await stop_background(app, config.shutdown_timeout)

    async def stop(app: web.Application) -> None:
        app[ADAPTER_SYNC].cancel()
        app[MODEL_WATCH].cancel()
        await gw.client.close()

    async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
        add_origin_headers(request, response, config.allowed_origins)

    app.on_response_prepare.append(cors_headers)
    app.on_response_prepare.append(echo_header)
    app.on_response_prepare.append(_anthropic_request_id)
    app.on_startup.append(start)
    app.on_shutdown.append(finish_background)
    app.on_cleanup.append(stop)
    return app
