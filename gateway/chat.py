"""POST /v1/chat/completions: validate, render, fan out n choices, answer in one body or as SSE.

Response shapes follow OpenAI's: ``chat.completion`` (choices[i].message with
content, reasoning_content, tool_calls) and ``chat.completion.chunk`` deltas
(the first carries the role, then content / reasoning_content / tool_calls,
then a chunk with finish_reason). vLLM's ``return_token_ids`` adds
``choices[i].token_ids`` and a top-level ``prompt_token_ids``.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ignis.gateway.chat_template import TemplateRenderError
from ignis.gateway.choice import ChoiceDelta, ChoiceState
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.generation import Generation
from ignis.gateway.messages import apply_developer_policy, parse_messages, parse_tool_choice, parse_tools
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.params import parse_common, sampling_for
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.responses import chat_logprobs, json_response, new_id, stream_sse
from ignis.gateway.state import STATE, GatewayState
from ignis.shared.wire import Generate

ENDPOINT = "chat"
_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "documents", "add_generation_prompt")


def _template_kwargs(f: Fields) -> dict:
    extra = f.object("chat_template_kwargs")
    if extra is None:
        return {}
    for key in _RESERVED_TEMPLATE_KWARGS:
        if key in extra.obj:
            raise extra.error(key, "is set by the server and cannot be passed")
    return dict(extra.obj)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw: GatewayState = request.app[STATE]
    started = time.monotonic()
    f = Fields(await gw.read_json(request))
    p = parse_common(f, request.headers, "chat")
    gw = gw.select(p.model)
    if gw.template is None:
        raise invalid("this model has no chat template; use /v1/completions", code="no_chat_template")
    messages = apply_developer_policy(parse_messages(f), gw.config.server_developer_message_policy)
    tools = parse_tools(f)
    choice = parse_tool_choice(f, tools)
    render_tools = None if choice.mode == "none" else tools
    try:
        # Rendering and tokenizing a long history takes a while: off the event loop, so streams keep flowing.
        prompt = await asyncio.to_thread(build_chat_prompt, gw.template, gw.tokenizer, messages, render_tools,
                                         _template_kwargs(f))
    except TemplateRenderError as e:
        raise invalid(str(e), "messages") from None
    if not prompt.ids:
        raise invalid("the rendered prompt is empty", "messages")
    max_tokens = await gw.max_tokens(len(prompt.ids), p.max_tokens, gw.config.default_max_tokens)
    rid = new_id("chatcmpl")
    gens = [Generate(id=f"{rid}-{i}", prompt_ids=tuple(prompt.ids), sampling=sampling_for(p, max_tokens, i),
                     system_end=prompt.system_end, opener_start=prompt.opener_start,
                     last_is_user=prompt.last_is_user, request_class=p.request_class, model=gw.model_name)
            for i in range(p.n)]
    choices = [ChoiceState(i, gw.tokenizer, stops=p.stops, stop_token_ids=p.stop_token_ids,
                           parser=OutputParser(reasoning=gw.reasoning_markers, tools=render_tools is not None,
                                               starts_in_reasoning=prompt.starts_in_reasoning))
               for i in range(p.n)]
    transport_gone = lambda: request.transport is None or request.transport.is_closing()  # noqa: E731
    head = {"id": rid, "created": int(time.time()), "model": gw.model_name}
    gw.metrics.active.inc()
    try:
        async with Generation(gw.client, gens, choices, transport_gone) as gen:
            await gen.open()
            gw.metrics.first_token(ENDPOINT, time.monotonic() - started)
            if p.stream:
                return await _stream(request, gw, gen, p, head, prompt.ids)
            return await _collect(gw, gen, p, head, prompt.ids)
    finally:
        gw.metrics.active.dec()


def _delta_json(gw: GatewayState, d: ChoiceDelta, p, first_call: int) -> dict:
    delta: dict = {}
    if d.reasoning:
        delta["reasoning_content"] = d.reasoning
    if d.content:
        delta["content"] = d.content
    if d.tool_calls:
        delta["tool_calls"] = [dict(c.to_json(), index=first_call + k) for k, c in enumerate(d.tool_calls)]
    choice = {"index": d.index, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
    if p.logprobs and d.logprobs:
        choice["logprobs"] = {"content": chat_logprobs(gw.tokenizer, d.logprobs)}
    if p.return_token_ids:
        choice["token_ids"] = d.token_ids
    return choice


async def _stream(request, gw: GatewayState, gen: Generation, p, head: dict, prompt_ids) -> web.StreamResponse:
    base = dict(head, object="chat.completion.chunk")
    extra = {"usage": None} if p.include_usage else {}
    first = dict(base, choices=[{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None} for i in range(p.n)], **extra)
    if p.return_token_ids:
        first["prompt_token_ids"] = list(prompt_ids)
    calls_seen = [0] * p.n

    wants_tokens = p.return_token_ids or p.logprobs

    def chunk_of(d: ChoiceDelta) -> dict | None:
        if not (d.has_text or d.finish_reason or (wants_tokens and d.token_ids)):
            return None
        first_call = calls_seen[d.index]
        calls_seen[d.index] += len(d.tool_calls)
        return dict(base, choices=[_delta_json(gw, d, p, first_call)], **extra)

    def usage_chunk(usage: dict) -> dict:
        return dict(base, choices=[], usage=usage)

    return await stream_sse(request, gen, [first], chunk_of, usage_chunk if p.include_usage else None,
                            on_tokens=gw.metrics.tokens.inc)


async def _collect(gw: GatewayState, gen: Generation, p, head: dict, prompt_ids) -> web.Response:
    acc = [{"content": "", "reasoning": "", "calls": [], "ids": [], "lps": [], "finish": None} for _ in range(p.n)]
    async for d in gen.deltas():
        a = acc[d.index]
        a["content"] += d.content
        a["reasoning"] += d.reasoning
        a["calls"].extend(d.tool_calls)
        a["ids"].extend(d.token_ids)
        a["lps"].extend(d.logprobs)
        if d.finish_reason:
            a["finish"] = d.finish_reason
    gw.metrics.tokens.inc(sum(len(a["ids"]) for a in acc))
    choices = []
    for i, a in enumerate(acc):
        message: dict = {"role": "assistant", "content": a["content"] if a["content"] or not a["calls"] else None}
        if a["reasoning"]:
            message["reasoning_content"] = a["reasoning"]
        if a["calls"]:
            message["tool_calls"] = [c.to_json() for c in a["calls"]]
        choice = {"index": i, "message": message, "logprobs": None, "finish_reason": a["finish"]}
        if p.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(gw.tokenizer, a["lps"])}
        if p.return_token_ids:
            choice["token_ids"] = a["ids"]
        choices.append(choice)
    body = dict(head, object="chat.completion", choices=choices, usage=gen.usage.to_json())
    if p.return_token_ids:
        body["prompt_token_ids"] = list(prompt_ids)
    return json_response(body)
