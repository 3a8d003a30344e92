"""POST /v1/completions: a raw prompt (text or token ids), no template, no marks, no parsing.

``prompt`` is a string, an array of token ids, or an array holding one of
those. ``max_tokens`` defaults to 16, as in OpenAI's API. ``echo`` puts the
prompt text in front of the completion (not combined with logprobs: prompt
logprobs are not computed). Responses are ``text_completion`` objects, with
the legacy logprobs format. Generating and answering is ``GenerationRequest.answer``'s.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.fields import Fields
from ignis.gateway.generation_request import EndpointResponse, GenerationRequest
from ignis.gateway.params import CommonParams
from ignis.gateway.responses import CompletionLogprobs, merge_completion_logprobs, new_id
from ignis.gateway.state import GatewayState
from ignis.gateway.tokenizer import TextTokenizer

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
    """Create a completion of a raw prompt."""
    req = await GenerationRequest.read(request, "completion")
    gw, f, p = req.gw, req.fields, req.params
    if f.has("suffix"):
        raise f.error("suffix", "is not supported")
    echo = f.bool("echo")
    if echo and p.logprobs:
        raise f.error("echo", "cannot be combined with logprobs (prompt logprobs are not computed)")
    ids, text = await _prompt(gw, f)
    max_tokens = await gw.max_tokens(len(ids), p.max_tokens, DEFAULT_MAX_TOKENS)
    echo_text = (text if text is not None else gw.tokenizer.decode(ids, skip_special_tokens=False)) if echo else ""
    rid = new_id("cmpl")
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": gw.model_name}
    return await req.answer(ENDPOINT, rid, ids, max_tokens, CompletionResponse(p, gw.tokenizer, head, echo_text))


class CompletionResponse(EndpointResponse):
    """``text_completion`` objects, streamed or whole, with legacy logprobs; ``echo_text`` opens every choice."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, echo_text: str):
        super().__init__(params, tokenizer, head, head)
        self.echo_text = echo_text
        # One per choice: text offsets run on across every delta of the choice.
        self.lps = [CompletionLogprobs() for _ in range(params.n)]
        self.acc = [{"text": echo_text, "lps": []} for _ in range(params.n)]

    def first_choices(self) -> list[dict]:
        if not self.echo_text:
            return []
        return [{"index": i, "text": self.echo_text, "logprobs": None, "finish_reason": None}
                for i in range(self.params.n)]

    def chunk_choice(self, d: ChoiceDelta) -> dict:
        choice = {"index": d.index, "text": d.content, "logprobs": None, "finish_reason": d.finish_reason}
        if self.params.logprobs and d.logprobs:
            choice["logprobs"] = self.lps[d.index].add(self.tokenizer, d.logprobs)
        return choice

    def chunk_choice_bytes(self, d: ChoiceDelta) -> bytes:
        if not (self.params.logprobs and d.logprobs):  # the bytes chunk_choice's dict serialises to
            return b'{"index":%d,"text":%b,"logprobs":null,"finish_reason":%b}' % (
                d.index, orjson.dumps(d.content), b"null" if d.finish_reason is None else orjson.dumps(d.finish_reason))
        return orjson.dumps(self.chunk_choice(d))

    def take(self, d: ChoiceDelta) -> None:
        a = self.acc[d.index]
        a["text"] += d.content
        if self.params.logprobs and d.logprobs:
            a["lps"].append(self.lps[d.index].add(self.tokenizer, d.logprobs))

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        a = self.acc[index]
        logprobs = merge_completion_logprobs(a["lps"]) if self.params.logprobs else None
        return {"index": index, "text": a["text"], "logprobs": logprobs, "finish_reason": finish_reason}
