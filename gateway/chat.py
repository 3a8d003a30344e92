"""POST /v1/chat/completions: messages, tools and template rendered into a prompt; chat-shaped choices.

Response shapes follow OpenAI's: ``chat.completion`` (choices[i].message with
content, reasoning_content, tool_calls) and ``chat.completion.chunk`` deltas
(the first carries the role, then content / reasoning_content / tool_calls,
then a chunk with finish_reason). vLLM's ``return_token_ids`` adds
``choices[i].token_ids`` and a top-level ``prompt_token_ids``. Generating and
answering is ``GenerationRequest.answer``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from aiohttp import web

from ignis.gateway.chat_template import TemplateRenderError
from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.generation_request import EndpointResponse, GenerationRequest
from ignis.gateway.grammars import after_reasoning
from ignis.gateway.messages import apply_developer_policy, parse_messages, parse_tool_choice, parse_tools
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.params import CommonParams
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.responses import chat_logprobs, new_id
from ignis.gateway.tokenizer import TextTokenizer

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
    req = await GenerationRequest.read(request, "chat")
    gw, f, p = req.gw, req.fields, req.params
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
    if p.grammar is not None and prompt.starts_in_reasoning:  # the grammar holds the answer, not the reasoning
        req.params = p = dataclasses.replace(p, grammar=after_reasoning(p.grammar))
    max_tokens = await gw.max_tokens(len(prompt.ids), p.max_tokens, gw.config.default_max_tokens)
    rid = new_id("chatcmpl")
    head = {"id": rid, "created": int(time.time()), "model": gw.model_name}
    marks = {"system_end": prompt.system_end, "opener_start": prompt.opener_start, "last_is_user": prompt.last_is_user}

    def parser() -> OutputParser:
        return OutputParser(reasoning=gw.reasoning_markers, tools=render_tools is not None,
                            starts_in_reasoning=prompt.starts_in_reasoning)

    return await req.answer(ENDPOINT, rid, prompt.ids, max_tokens, ChatResponse(p, gw.tokenizer, head),
                            marks=marks, parser=parser)


class ChatResponse(EndpointResponse):
    """``chat.completion`` bodies and ``chat.completion.chunk`` deltas."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict):
        super().__init__(params, tokenizer, dict(head, object="chat.completion"),
                         dict(head, object="chat.completion.chunk"))
        # Tool calls streamed so far per choice: each new call's index continues from here.
        self.calls_seen = [0] * params.n
        self.acc = [{"content": "", "reasoning": "", "calls": [], "lps": []} for _ in range(params.n)]

    def first_choices(self) -> list[dict]:
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(self.params.n)]

    def chunk_choice(self, d: ChoiceDelta) -> dict:
        first_call = self.calls_seen[d.index]
        self.calls_seen[d.index] += len(d.tool_calls)
        delta: dict = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            delta["tool_calls"] = [dict(c.to_json(), index=first_call + k) for k, c in enumerate(d.tool_calls)]
        choice = {"index": d.index, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
        if self.params.logprobs and d.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(self.tokenizer, d.logprobs)}
        return choice

    def take(self, d: ChoiceDelta) -> None:
        a = self.acc[d.index]
        a["content"] += d.content
        a["reasoning"] += d.reasoning
        a["calls"].extend(d.tool_calls)
        a["lps"].extend(d.logprobs)

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        a = self.acc[index]
        message: dict = {"role": "assistant", "content": a["content"] if a["content"] or not a["calls"] else None}
        if a["reasoning"]:
            message["reasoning_content"] = a["reasoning"]
        if a["calls"]:
            message["tool_calls"] = [c.to_json() for c in a["calls"]]
        choice = {"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason}
        if self.params.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(self.tokenizer, a["lps"])}
        return choice
