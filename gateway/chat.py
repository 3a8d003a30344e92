"""POST /v1/chat/completions: messages, tools and template rendered into a prompt; chat-shaped choices.

Response shapes follow OpenAI's: ``chat.completion`` (choices[i].message with
content, reasoning_content, tool_calls) and ``chat.completion.chunk`` deltas
(the first carries the role, then content / reasoning_content / tool_calls,
then a chunk with finish_reason). The reasoning also goes as ``reasoning``,
the name vLLM now uses; vLLM's ``include_reasoning: false`` leaves it out. A streamed call's pieces that arrive
together are one ``tool_calls`` entry. ``tool_choice`` "required" or a named
function appends the call's opener to the rendered prompt
(``tool_call_format.forced_call_suffix``) and the choices' parsers start
inside that call. ``parallel_tool_calls: false`` keeps the first call: a choice
ends (its engine stream aborted, "tool_calls") as a second one begins. vLLM's
``prompt_logprobs`` adds a top-level list; ``return_token_ids`` adds
``choices[i].token_ids`` and a top-level ``prompt_token_ids``; its
``thinking_token_budget`` counts from the first token when the prompt opened
the thinking block (``gateway.thinking_budget``). Generating and
answering is ``GenerationRequest.answer``'s; ``answer_chat`` is the part
/v1/responses shares (it hands its own ``EndpointResponse``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from ignis.gateway.chat_template import TemplateRenderError
from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.generation import Usage
from ignis.gateway.generation_request import EndpointResponse, GenerationRequest
from ignis.gateway.grammars import after_reasoning
from ignis.gateway.image_limits import parse_mm_limit
from ignis.gateway.image_sources import MediaPolicy
from ignis.gateway.messages import (
    apply_developer_policy,
    check_tool_results,
    image_urls,
    parse_messages,
    parse_tool_choice,
    parse_tools,
    prompt_tools,
    text_of,
)
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.params import CommonParams
from ignis.gateway.part_marks import part_end
from ignis.gateway.prompt import ChatPrompt, build_chat_prompt
from ignis.gateway.prompt_images import check_image_count, expand_placeholders, load_images, refuse_stray_placeholders
from ignis.gateway.prompt_logprobs import prompt_logprobs_json
from ignis.gateway.conversation_fit import answer_room, fit_messages
from ignis.gateway.prompt_truncation import MARKS, kept_tokens, truncate
from ignis.gateway.prompt_work import prompt_work
from ignis.gateway.reasoning_effort import EFFORTS, with_effort
from ignis.gateway.request_ids import response_id
from ignis.gateway.responses import chat_logprobs
from ignis.gateway.tokenizer import TextTokenizer
from ignis.gateway.tool_call_format import forced_call_suffix, resolve_format
from ignis.gateway.tool_call_split import forced_call
from ignis.gateway.tool_grammars import auto_calls_grammar, forced_call_grammar

log = logging.getLogger("ignis.gateway")

ENDPOINT = "chat"
_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "documents", "add_generation_prompt")


def _media_policy(config) -> MediaPolicy:
    return MediaPolicy(config.allowed_media_domains, config.max_image_bytes, config.media_fetch_timeout)


def template_kwargs(f: Fields) -> dict:
    """``chat_template_kwargs`` as extra template variables (the server's own names refused), with what
    OpenAI's ``reasoning_effort`` says where they are silent (``gateway.reasoning_effort``)."""
    if f.raw("chat_template") is not None:  # vLLM refuses one too, unless told to trust requests' templates
        raise f.error("chat_template", "is not taken from a request: the server renders with its model's template "
                                       "(or the one --chat-template names)")
    effort = f.str("reasoning_effort", choices=EFFORTS)
    extra = f.object("chat_template_kwargs")
    if extra is None:
        return with_effort({}, effort)
    for key in _RESERVED_TEMPLATE_KWARGS:
        if key in extra.obj:
            raise extra.error(key, "is set by the server and cannot be passed")
    return with_effort(dict(extra.obj), effort)


@contextlib.contextmanager
def rendering_errors():
    """A template's refusal of a conversation, or input it recursed or computed on past its limits: a 400."""
    try:
        yield
    except TemplateRenderError as e:
        raise invalid(str(e), "messages") from None
    except (RecursionError, ArithmeticError):
        raise invalid("the chat template cannot render this conversation (nested too deeply, or a number out "
                      "of range)", "messages", code="template_failed") from None


def with_suffix(tok: TextTokenizer, prompt: ChatPrompt, suffix: str) -> list[int]:
    """The prompt's ids with ``suffix`` appended, tokenized with the prompt's text as one text (so
    ``<think>\n`` + ``\n</think>`` gives the one "\n\n" token a whole prompt has), unless that changes
    a token before a capture mark; then the suffix is tokenized alone."""
    ids = tok.encode(prompt.text + suffix)
    keep = max((m for m in (prompt.system_end, prompt.opener_start) if m is not None), default=0)
    if len(ids) > len(prompt.ids) and ids[:keep] == prompt.ids[:keep]:
        return ids
    return prompt.ids + tok.encode(suffix)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Create a chat completion."""
    req = await GenerationRequest.read(request, "chat")
    include_reasoning = req.fields.bool("include_reasoning", True)  # vLLM's: false leaves the reasoning out
    echo = _echoed(req.fields)
    return await answer_chat(req, ENDPOINT, response_id("chatcmpl", req.client_id),
                             lambda p, tok, head: ChatResponse(p, tok, {"id": head["id"], "created": int(time.time()),
                                                                     "model": head["model"]}, include_reasoning, echo))


def _echoed(f: Fields) -> str:
    """vLLM's ``echo``: with ``continue_final_message``, the answer's content starts with the text of the
    assistant message it continues ("" otherwise)."""
    if not f.bool("echo") or not f.bool("continue_final_message"):
        return ""
    messages = f.raw("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return text_of(last.get("content")) if isinstance(last, dict) and last.get("role") == "assistant" else ""


async def answer_chat(req: GenerationRequest, endpoint: str, rid: str,
                      make_response: Callable[[CommonParams, TextTokenizer, dict], EndpointResponse]
                      ) -> web.StreamResponse:
    """Render ``req``'s chat-shaped fields (messages, tools, tool_choice, chat_template_kwargs) into a
    prompt, generate, and answer through ``make_response(params, tokenizer, {"id", "model"})``: the one
    path of /v1/chat/completions and /v1/responses."""
    gw, f, p = req.gw, req.fields, req.params
    if gw.template is None:
        raise invalid("this model has no chat template; use /v1/completions", code="no_chat_template")
    messages = parse_messages(f)
    check_tool_results(messages)
    messages = apply_developer_policy(messages, gw.config.server_developer_message_policy,
                                      gw.template.takes_late_system)
    urls = image_urls(messages)
    check_image_count(len(urls), gw.vision, parse_mm_limit(gw.config.limit_mm_per_prompt))
    tools = parse_tools(f)
    choice = parse_tool_choice(f, tools)
    render_tools = prompt_tools(tools, choice, gw.config.exclude_tools_when_tool_choice_none)
    call_tools = None if choice.mode == "none" else tools  # the tools a call may name: none under "none"
    tool_format = resolve_format(gw.config.tool_call_parser, gw.template.source) if call_tools else None
    forced = forced_call(choice, call_tools)
    if call_tools and p.grammar is not None and (forced is not None or choice.allowed is not None):
        raise invalid("response_format cannot be combined with a required, named or allowed_tools tool_choice: "
                      "the calls' arguments follow the tools' parameters schemas", "response_format")
    continuing, opener = _continues(f)
    if continuing and forced is not None:
        raise f.error("continue_final_message", "cannot be combined with a required or named tool_choice")
    if not opener and not continuing and forced is not None:
        raise f.error("add_generation_prompt", "false cannot be combined with a required or named tool_choice: "
                      "the call opens the assistant turn the generation prompt starts")
    # false: the first call is the answer; the choice ends when a second one begins
    max_calls = None if f.bool("parallel_tool_calls", True) else 1
    kwargs = template_kwargs(f)
    work = prompt_work(req.http)
    with rendering_errors():
        # Rendering and tokenizing a long history takes a while: off the event loop, so streams keep flowing.
        prompt = await work.run(build_chat_prompt, gw.template, gw.tokenizer, messages, render_tools, kwargs,
                                continuing, opener)
        if req.fit_context and opener:
            max_len = await gw.max_model_len()
            budget = max_len - (p.max_tokens or answer_room(max_len))
            if len(prompt.ids) > budget:
                messages, prompt = await work.run(_fitted, gw, messages, render_tools, kwargs, budget, prompt)
                urls = image_urls(messages)
        part = await work.run(part_end, gw.template, gw.tokenizer, messages[:-1] if continuing else messages,
                              render_tools, kwargs, prompt.ids, prompt.opener_start)
    if not prompt.ids:
        raise invalid("the rendered prompt is empty", "messages")
    if call_tools and choice.mode == "auto" and p.grammar is None:
        # calls held to the allowed tools and the strict tools' schemas (response_format, when given, holds
        # the whole answer instead)
        held = await work.run(auto_calls_grammar, call_tools, tool_format, gw.metrics, choice.allowed, req.notes)
        if held is not None:
            req.params = p = dataclasses.replace(p, grammar=held)
    if p.grammar is not None and prompt.starts_in_reasoning and forced is None:
        # the grammar holds the answer, not the reasoning (a forced call's opener closes the reasoning itself)
        req.params = p = dataclasses.replace(p, grammar=after_reasoning(p.grammar))
    if p.thinking is not None:
        # counting starts at once in a block the prompt opened; a forced call's opener closes the block: no budget
        req.params = p = dataclasses.replace(p, thinking=None if forced is not None else p.thinking,
                                             thinking_open=prompt.starts_in_reasoning)
    prompt_ids = prompt.ids
    if forced is not None:
        # The call opener goes after the generation prompt: the model continues inside the call, and a
        # grammar holds the rest of it to the tool's parameters.
        grammar = await work.run(forced_call_grammar, forced, call_tools, tool_format, gw.metrics, choice.allowed,
                                 max_calls is None, req.notes)
        req.params = p = dataclasses.replace(p, grammar=grammar)
        suffix = forced_call_suffix(tool_format, forced.name, prompt.starts_in_reasoning)
        prompt_ids = await work.run(with_suffix, gw.tokenizer, prompt, suffix)
    marks = {"system_end": prompt.system_end, "opener_start": prompt.opener_start, "last_is_user": prompt.last_is_user,
             "mark_missing": prompt.marks.missing_text, "part_end": part}
    images = ()
    if urls:
        images = await load_images(urls, gw.vision, _media_policy(gw.config), gw.config.max_image_source_pixels,
                                   work)
        prompt_ids, marks = expand_placeholders(prompt_ids, images, gw.vision, marks)
    else:
        refuse_stray_placeholders(prompt_ids, gw.vision, "messages")
    missing = prompt.marks.missing
    if p.truncate_prompt_tokens is not None:
        keep = kept_tokens(p.truncate_prompt_tokens, await gw.max_model_len(), p.max_tokens)
        found = marks
        prompt_ids, marks = truncate(prompt_ids, keep, marks, gw.vision.image_token_id if images else None)
        missing += tuple((m, "truncated") for m in MARKS if found.get(m) is not None and marks.get(m) is None)
    default = gw.config.default_max_tokens or gw.sampling_defaults.max_new_tokens  # the operator's, else the model's
    max_tokens = await gw.max_tokens(len(prompt_ids), p.max_tokens, default)
    head = {"id": rid, "model": gw.model_name}
    gw.metrics.mark_missing(missing)

    def parser() -> OutputParser:
        return OutputParser(reasoning=gw.reasoning_markers, starts_in_reasoning=prompt.starts_in_reasoning,
                            tool_format=tool_format, tools=call_tools, forced=forced, max_calls=max_calls)

    return await req.answer(endpoint, rid, prompt_ids, max_tokens, make_response(p, gw.tokenizer, head),
                            marks=marks, parser=parser, images=images)


def _fitted(gw, messages: list[dict], tools, kwargs: dict, budget: int, prompt):
    """(messages, prompt) with the earliest turns dropped until the prompt is at most ``budget`` tokens
    (``gateway.conversation_fit``); as given when no cut fits."""
    rendered = {len(messages): prompt}

    def length_of(kept: list[dict]) -> int:
        if len(kept) not in rendered:
            rendered[len(kept)] = build_chat_prompt(gw.template, gw.tokenizer, kept, tools, kwargs)
        return len(rendered[len(kept)].ids)

    kept, dropped = fit_messages(messages, length_of, budget)
    if dropped:
        log.info("truncation auto: dropped the %d earliest messages of %d (prompt %d -> %d tokens, budget %d)",
                 dropped, len(messages), len(prompt.ids), len(rendered[len(kept)].ids), budget)
    return kept, rendered[len(kept)]


def _continues(f: Fields) -> tuple[bool, bool]:
    """(continuing, opener): vLLM's ``continue_final_message`` (the model writes on from the last assistant
    message) and ``add_generation_prompt`` (default: not when continuing; false alone: the conversation
    with no generation prompt, the model writing on after its last turn)."""
    continuing = f.bool("continue_final_message")
    opener = f.bool("add_generation_prompt", not continuing)
    if continuing and opener:
        raise f.error("add_generation_prompt", "cannot be true with continue_final_message")
    return continuing, opener


class ChatResponse(EndpointResponse):
    """``chat.completion`` bodies and ``chat.completion.chunk`` deltas."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, include_reasoning: bool = True,
                 echo: str = ""):
        super().__init__(params, tokenizer, dict(head, object="chat.completion"),
                         dict(head, object="chat.completion.chunk"))
        self.include_reasoning = include_reasoning
        self.echo = echo  # opens every choice's content (vLLM's echo with continue_final_message)
        # Per choice; "calls" holds OpenAI tool-call objects, position = the call's index.
        self.acc = [{"content": echo, "reasoning": "", "thought": False, "calls": [], "lps": [], "stop_reason": None}
                    for _ in range(params.n)]

    def first_choices(self) -> list[dict]:
        return [{"index": i, "delta": {"role": "assistant", "content": self.echo}, "logprobs": None,
                 "finish_reason": None} for i in range(self.params.n)]

    def _prompt_logprobs(self) -> dict:
        """vLLM's top-level ``prompt_logprobs`` (every choice shares the prompt), when asked."""
        if self.params.prompt_logprobs is None:
            return {}
        ids, scores = self.prompts[0]
        return {"prompt_logprobs": prompt_logprobs_json(ids, scores, self.tokenizer)}

    def first_extra(self) -> dict:
        return self._prompt_logprobs()

    def body(self, choices: list[dict], usage: Usage) -> dict:
        return dict(super().body(choices, usage), **self._prompt_logprobs())

    def chunk_choice(self, d: ChoiceDelta) -> dict:
        delta: dict = {}
        if d.reasoning and self.include_reasoning:
            delta["reasoning_content"] = delta["reasoning"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            calls: list[dict] = []
            for piece in d.tool_calls:  # pieces of one call in one chunk become one entry
                if calls and calls[-1]["index"] == piece.index:
                    calls[-1]["function"]["arguments"] += piece.arguments
                else:
                    calls.append(piece.to_json())
            delta["tool_calls"] = calls
        choice = {"index": d.index, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
        if d.finish_reason is not None:
            choice["stop_reason"] = d.stop_reason
        if self.params.logprobs and d.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(self.tokenizer, d.logprobs,
                                                           self.params.return_tokens_as_token_ids)}
        return choice

    def chunk_choice_bytes(self, d: ChoiceDelta) -> bytes:
        if d.finish_reason is None and not d.tool_calls and not (self.params.logprobs and d.logprobs):
            # the common chunk, text of one kind: the bytes chunk_choice's dict serialises to
            if d.content and not d.reasoning:
                return b'{"index":%d,"delta":{"content":%b},"logprobs":null,"finish_reason":null}' % (
                    d.index, orjson.dumps(d.content))
            if d.reasoning and not d.content and self.include_reasoning:
                text = orjson.dumps(d.reasoning)
                return (b'{"index":%d,"delta":{"reasoning_content":%b,"reasoning":%b},"logprobs":null,'
                        b'"finish_reason":null}' % (d.index, text, text))
        return orjson.dumps(self.chunk_choice(d))

    def take(self, d: ChoiceDelta) -> None:
        a = self.acc[d.index]
        a["content"] += d.content
        a["reasoning"] += d.reasoning
        a["thought"] = a["thought"] or bool(d.reasoning_tokens)  # a thinking block, if only of newlines
        for piece in d.tool_calls:
            if piece.id is not None:
                a["calls"].append({"id": piece.id, "type": "function",
                                   "function": {"name": piece.name, "arguments": piece.arguments}})
            else:
                a["calls"][piece.index]["function"]["arguments"] += piece.arguments
        a["lps"].extend(d.logprobs)
        if d.finish_reason is not None:
            a["stop_reason"] = d.stop_reason

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        a = self.acc[index]
        # vLLM's: no content beside reasoning or calls is null, not "" (as a stream leaves it out)
        content = a["content"] or (None if a["calls"] or a["reasoning"] or a["thought"] else "")
        message: dict = {"role": "assistant", "content": content}
        if a["reasoning"] and self.include_reasoning:
            message["reasoning_content"] = message["reasoning"] = a["reasoning"]
        if a["calls"]:
            message["tool_calls"] = a["calls"]
        choice = {"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": a["stop_reason"]}
        if self.params.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(self.tokenizer, a["lps"],
                                                           self.params.return_tokens_as_token_ids)}
        return choice
