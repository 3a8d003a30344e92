"""POST /v1/completions: a raw prompt (text or token ids), no template, no marks, no parsing.

``prompt`` is a string, an array of token ids, or an array holding one of
those. ``max_tokens`` defaults to 16, as in OpenAI's API. ``echo`` puts the
prompt text in front of the completion (not combined with logprobs: prompt
logprobs are not computed). Responses are ``text_completion`` objects, with
the legacy logprobs format.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ignis.gateway.choice import ChoiceDelta, ChoiceState
from ignis.gateway.fields import Fields
from ignis.gateway.generation import Generation
from ignis.gateway.params import parse_common, sampling_for
from ignis.gateway.responses import CompletionLogprobs, json_response, merge_completion_logprobs, new_id, stream_sse
from ignis.gateway.state import STATE, GatewayState
from ignis.shared.wire import Generate

ENDPOINT = "completions"
DEFAULT_MAX_TOKENS = 16
LONG_TEXT = 20_000
"""Prompts longer than this (characters) are tokenized on a worker thread."""


async def _prompt(gw: GatewayState, f: Fields) -> tuple[list[int], str | None]:
    """The prompt's token ids, and its text when it came as text."""
    value = f.raw("prompt")
    if value is None:
        raise f.error("prompt", "is required")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if len(value) > LONG_TEXT:  # off the event loop, so streams keep flowing
            ids = await asyncio.to_thread(gw.tokenizer.encode, value, True)
        else:
            ids = gw.tokenizer.encode(value, add_special_tokens=True)
        text = value
    elif isinstance(value, list) and all(type(t) is int for t in value):
        ids, text = value, None
        bad = next((t for t in ids if not 0 <= t < gw.tokenizer.vocab_size), None)
        if bad is not None:
            raise f.error("prompt", f"token id {bad} is outside the vocabulary (size {gw.tokenizer.vocab_size})")
    elif isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        raise f.error("prompt", "only one prompt per request is supported")
    else:
        raise f.error("prompt", "must be a string, an array of token ids, or an array holding one of those")
    if not ids:
        raise f.error("prompt", "is empty")
    return ids, text


async def completions(request: web.Request) -> web.StreamResponse:
    gw: GatewayState = request.app[STATE]
    started = time.monotonic()
    f = Fields(await gw.read_json(request))
    p = parse_common(f, request.headers, "completion")
    gw = gw.select(p.model)
    if f.has("suffix"):
        raise f.error("suffix", "is not supported")
    echo = f.bool("echo")
    if echo and p.logprobs:
        raise f.error("echo", "cannot be combined with logprobs (prompt logprobs are not computed)")
    ids, text = await _prompt(gw, f)
    max_tokens = await gw.max_tokens(len(ids), p.max_tokens, DEFAULT_MAX_TOKENS)
    echo_text = (text if text is not None else gw.tokenizer.decode(ids, skip_special_tokens=False)) if echo else ""
    rid = new_id("cmpl")
    gens = [Generate(id=f"{rid}-{i}", prompt_ids=tuple(ids), sampling=sampling_for(p, max_tokens, i),
                     request_class=p.request_class, model=gw.model_name) for i in range(p.n)]
    choices = [ChoiceState(i, gw.tokenizer, stops=p.stops, stop_token_ids=p.stop_token_ids) for i in range(p.n)]
    transport_gone = lambda: request.transport is None or request.transport.is_closing()  # noqa: E731
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": gw.model_name}
    gw.metrics.active.inc()
    try:
        async with Generation(gw.client, gens, choices, transport_gone) as gen:
            await gen.open()
            gw.metrics.first_token(ENDPOINT, time.monotonic() - started)
            if p.stream:
                return await _stream(request, gw, gen, p, head, ids, echo_text)
            return await _collect(gw, gen, p, head, ids, echo_text)
    finally:
        gw.metrics.active.dec()


async def _stream(request, gw: GatewayState, gen: Generation, p, head: dict, ids, echo_text: str):
    extra = {"usage": None} if p.include_usage else {}
    lps = [CompletionLogprobs() for _ in range(p.n)]
    prelude = []
    if echo_text:
        prelude = [dict(head, choices=[{"index": i, "text": echo_text, "logprobs": None, "finish_reason": None}
                                       for i in range(p.n)], **extra)]

    wants_tokens = p.return_token_ids or p.logprobs

    def chunk_of(d: ChoiceDelta) -> dict | None:
        if not (d.has_text or d.finish_reason or (wants_tokens and d.token_ids)):
            return None
        choice = {"index": d.index, "text": d.content, "logprobs": None, "finish_reason": d.finish_reason}
        if p.logprobs and d.logprobs:
            choice["logprobs"] = lps[d.index].add(gw.tokenizer, d.logprobs)
        if p.return_token_ids:
            choice["token_ids"] = d.token_ids
        return dict(head, choices=[choice], **extra)

    def usage_chunk(usage: dict) -> dict:
        return dict(head, choices=[], usage=usage)

    if p.return_token_ids and prelude:
        prelude[0]["prompt_token_ids"] = list(ids)
    elif p.return_token_ids:
        prelude = [dict(head, choices=[], prompt_token_ids=list(ids), **extra)]
    return await stream_sse(request, gen, prelude, chunk_of, usage_chunk if p.include_usage else None,
                            on_tokens=gw.metrics.tokens.inc)


async def _collect(gw: GatewayState, gen: Generation, p, head: dict, ids, echo_text: str) -> web.Response:
    acc = [{"text": echo_text, "ids": [], "lps": [], "finish": None} for _ in range(p.n)]
    lps = [CompletionLogprobs() for _ in range(p.n)]
    async for d in gen.deltas():
        a = acc[d.index]
        a["text"] += d.content
        a["ids"].extend(d.token_ids)
        if p.logprobs and d.logprobs:
            a["lps"].append(lps[d.index].add(gw.tokenizer, d.logprobs))
        if d.finish_reason:
            a["finish"] = d.finish_reason
    gw.metrics.tokens.inc(sum(len(a["ids"]) for a in acc))
    choices = []
    for i, a in enumerate(acc):
        logprobs = merge_completion_logprobs(a["lps"]) if p.logprobs else None
        choice = {"index": i, "text": a["text"], "logprobs": logprobs, "finish_reason": a["finish"]}
        if p.return_token_ids:
            choice["token_ids"] = a["ids"]
        choices.append(choice)
    body = dict(head, choices=choices, usage=gen.usage.to_json())
    if p.return_token_ids:
        body["prompt_token_ids"] = list(ids)
    return json_response(body)
