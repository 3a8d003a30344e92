"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat path.

A request body is translated into a chat completions body, which then takes
the chat path unchanged (``chat.answer_chat``: developer policy, chat
template, capture marks and prompt reuse, tool-call and reasoning parsers,
grammars of forced calls, usage); only the answer's shape differs
(``gateway.messages_output``)::

    system (a string or text blocks)    one system message (blocks joined by newlines)
    messages, role user                 text and image blocks (base64 or url sources) -> content parts;
                                        tool_result blocks -> tool messages (tool_call_id = tool_use_id;
                                        their text, or parts when they hold images), before the rest of that turn;
                                        is_error: true -> the text starts "Error: " (ERROR_MARK)
    messages, role assistant            text -> content, thinking -> reasoning_content,
                                        tool_use -> tool_calls (input as JSON arguments);
                                        a last assistant turn is a prefill: the answer continues
                                        its text (continue_final_message)
    tools [{name, description, input_schema, strict}]  functions (strict: the input is held to the schema);
                                        Anthropic's server tools are a 400
    tool_choice auto | any | tool | none              auto | required | named function | none;
                                        disable_parallel_tool_use: only the first call is answered
    thinking {type: enabled | disabled}  chat_template_kwargs.enable_thinking (the template's default when absent)
    thinking.budget_tokens (enabled)     thinking_token_budget (any positive integer; Anthropic's own floor of
                                        1,024 and its bound below max_tokens are not enforced)
    stop_sequences                      stop (at most 64)
    output_config.format {type: json_schema, schema}   response_format json_schema, strict: the text is JSON
                                        valid under the schema (structured outputs; the beta's top-level
                                        output_format the same); output_config.effort taken, not acted on
    max_tokens (required), temperature, top_p, top_k, stream     as given
    metadata, service_tier, container, cache_control on blocks   ignored

Both routes take the key as ``x-api-key`` or ``Authorization: Bearer``, and
answer errors in Anthropic's shape (``{"type": "error", "error": {"type",
"message"}}``, ``gateway.app``). count_tokens answers ``{"input_tokens"}``:
the prompt the same body would send, as /tokenize counts it.
"""

from __future__ import annotations

import json
import logging
import re

from aiohttp import web

from ignis.gateway.chat import answer_chat
from ignis.gateway.engine_client import EngineUnavailable
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.generation import EngineFailed
from ignis.gateway.generation_request import GenerationRequest, read_request_body
from ignis.gateway.messages import breaks_call_markup
from ignis.gateway.messages_output import EarlyStart, MessagesResponse, message_id
from ignis.gateway.params import CommonParams
from ignis.gateway.prompt_work import prompt_work
from ignis.gateway.request_ids import client_request_id, remember
from ignis.gateway.responses import json_response
from ignis.gateway.state import STATE, GatewayState
from ignis.gateway.tokenize_api import render_chat_ids
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")
ENDPOINT = "messages"
PATH_PREFIX = "/v1/messages"
PASSED = ("model", "temperature", "top_p", "top_k", "stream", "max_tokens", "request_class", "seed")
"""Fields handed to the chat path as they are (same names, same checks)."""
EFFORTS = ("low", "medium", "high", "max")
"""``output_config.effort`` values taken (and not acted on: the model's thinking is on or off, ``thinking``)."""
ROLES = ("user", "assistant")
REQUEST_ID = web.RequestKey("ignis_anthropic_request_id", str)
"""Where a Messages request's id is kept on the aiohttp request: its ``request-id`` header and the
``request_id`` of its error bodies (``gateway.app``)."""
ERROR_MARK = "Error: "
"""Put before the text of a tool_result with ``is_error: true`` that does not already start with "error"
(the chat templates have no field for it)."""


def _text_of(f: Fields, name: str, blocks: object) -> str:
    """A string, or text blocks joined by newlines (other block types: a 400)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise f.error(name, "must be a string or an array of text blocks")
    parts = []
    for j, block in enumerate(blocks):
        bf = Fields(block, f"{f.param(name)}[{j}]")
        if bf.str("type") != "text":
            raise bf.error("type", "only text blocks are taken here")
        parts.append(bf.str("text") or "")
    return "\n".join(parts)


def _image_part(bf: Fields) -> dict:
    source = bf.object("source")
    if source is None:
        raise bf.error("source", "is required")
    kind = source.str("type", choices=("base64", "url"))
    if kind == "base64":
        media = source.str("media_type", max_chars=64) or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source.str('data') or ''}"}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": source.str("url") or ""}}
    raise source.error("type", "must be 'base64' or 'url'")


def _tool_result(bf: Fields) -> str | list[dict]:
    """A tool_result block's content: its text (text blocks joined by newlines), or parts when it holds images;
    with ``is_error: true``, marked as a failure (``ERROR_MARK``) unless its text already says so."""
    content = _tool_content(bf)
    if not bf.bool("is_error"):
        return content
    if isinstance(content, str):
        return content if content.lstrip().lower().startswith("error") else (ERROR_MARK + content).rstrip()
    first = next((p for p in content if p["type"] == "text"), None)
    if first is not None and first["text"].lstrip().lower().startswith("error"):
        return content
    return [{"type": "text", "text": ERROR_MARK.rstrip()}] + content


def _tool_content(bf: Fields) -> str | list[dict]:
    result = bf.raw("content")
    if result is None or isinstance(result, str) or not isinstance(result, list):
        return "" if result is None else _text_of(bf, "content", result)
    if not any(isinstance(b, dict) and b.get("type") == "image" for b in result):
        return _text_of(bf, "content", result)
    parts = []
    for j, block in enumerate(result):
        cf = Fields(block, f"{bf.param('content')}[{j}]")
        kind = cf.str("type")
        if kind == "image":
            parts.append(_image_part(cf))
        elif kind == "text":
            parts.append({"type": "text", "text": cf.str("text") or ""})
        else:
            raise cf.error("type", "only text and image blocks are taken in a tool_result")
    return parts


_format_with_tools_warned = False


def _warn_format_with_tools() -> None:
    global _format_with_tools_warned
    if not _format_with_tools_warned:
        _format_with_tools_warned = True
        log.warning("output_config.format with callable tools: the tools stay callable and the format is not "
                    "enforced (this is said once)")


class MessagesTurn:
    """One /v1/messages request: its body as a chat body, and the answer's shape."""

    def __init__(self):
        self.rid = message_id()
        self.notes: list[str] = []  # what this request could not honour (GenerationRequest.notes)
        self.fields: Fields | None = None  # the body as sent (translate): what it read of it
        self.origins: list[str] = []  # the Anthropic field each chat message came from
        self.call_origins: dict[int, list[str]] = {}  # chat message index -> the tool_use block of each call
        self.parallel = True
        self.format_field = ""  # where the structured-output format came from (output_config.format, output_format)

    def _user(self, mf: Fields, content: object, out: list[dict]) -> None:
        if isinstance(content, str):
            out.append({"role": "user", "content": content})
            self.origins.append(mf.where)
            return
        parts: list[dict] = []
        for j, block in enumerate(content):
            bf = Fields(block, f"{mf.param('content')}[{j}]")
            kind = bf.str("type")
            if kind == "text":
                parts.append({"type": "text", "text": bf.str("text") or ""})
            elif kind == "image":
                parts.append(_image_part(bf))
            elif kind == "tool_result":
                out.append({"role": "tool", "tool_call_id": bf.str("tool_use_id", max_chars=256) or "",
                            "content": _tool_result(bf)})
                self.origins.append(bf.where)
            elif kind in ("document", "search_result", "server_tool_use", "web_search_tool_result"):
                raise bf.error("type", f"{kind!r} blocks are not supported")
            else:
                raise bf.error("type", f"unknown block type {kind!r} in a user turn")
        if parts:
            out.append({"role": "user", "content": parts})
            self.origins.append(mf.where)

    def _assistant(self, mf: Fields, content: object, out: list[dict]) -> None:
        if isinstance(content, str):
            out.append({"role": "assistant", "content": content})
            self.origins.append(mf.where)
            return
        text, reasoning, calls = [], [], []
        for j, block in enumerate(content):
            bf = Fields(block, f"{mf.param('content')}[{j}]")
            kind = bf.str("type")
            if kind == "text":
                text.append(bf.str("text") or "")
            elif kind == "thinking":
                reasoning.append(bf.str("thinking") or "")
            elif kind == "redacted_thinking":
                continue
            elif kind == "tool_use":
                arguments = bf.raw("input")
                if not isinstance(arguments, dict):
                    raise bf.error("input", "must be an object")
                calls.append({"id": bf.str("id", max_chars=256) or "", "type": "function",
                              "function": {"name": bf.str("name") or "", "arguments": json.dumps(arguments)}})
                self.call_origins.setdefault(len(out), []).append(bf.where)
            else:
                raise bf.error("type", f"unknown block type {kind!r} in an assistant turn")
        m: dict = {"role": "assistant", "content": "".join(text)}
        if reasoning:
            m["reasoning_content"] = "".join(reasoning)
        if calls:
            m["tool_calls"] = calls
        out.append(m)
        self.origins.append(mf.where)

    def _messages(self, f: Fields) -> list[dict]:
        out: list[dict] = []
        system = f.raw("system")
        if system is not None:
            out.append({"role": "system", "content": _text_of(f, "system", system)})
            self.origins.append("system")
        turns = f.list("messages", required=True)
        if not turns:
            raise f.error("messages", "must hold at least one message")
        for i, turn in enumerate(turns):
            mf = Fields(turn, f"messages[{i}]")
            role = mf.str("role", choices=ROLES)
            if role is None:
                raise mf.error("role", "is required")
            content = mf.raw("content")
            if not isinstance(content, (str, list)):
                raise mf.error("content", "must be a string or an array of content blocks")
            if role == "user" and not content:
                # Anthropic's rule: only a final assistant turn may be empty (dropped, an empty user turn
                # would have made the turn before it a prefill)
                raise mf.error("content", "a user message must have non-empty content")
            if role == "assistant" and i == len(turns) - 1 and _empty(content):
                break  # an empty final assistant turn: no prefill, the answer is a new turn
            (self._user if role == "user" else self._assistant)(mf, content, out)
        return self._combined(out)

    def _combined(self, out: list[dict]) -> list[dict]:
        """Consecutive turns of one role as one turn, as Anthropic combines them: user turns' parts joined,
        an assistant turn without calls joined with the next one (its text, reasoning and calls after)."""
        merged: list[dict] = []
        origins: list[str] = []
        calls: dict[int, list[str]] = {}
        for k, m in enumerate(out):
            last = merged[-1] if merged else None
            if last is not None and m["role"] == last["role"] == "user":
                last["content"] = _parts(last["content"]) + _parts(m["content"])
            elif last is not None and m["role"] == last["role"] == "assistant" and not last.get("tool_calls"):
                last["content"] = (last.get("content") or "") + (m.get("content") or "")
                if m.get("reasoning_content"):
                    last["reasoning_content"] = last.get("reasoning_content", "") + m["reasoning_content"]
                if m.get("tool_calls"):
                    last["tool_calls"] = m["tool_calls"]
                    calls[len(merged) - 1] = self.call_origins.get(k, [])
            else:
                merged.append(dict(m))
                origins.append(self.origins[k])
                if k in self.call_origins:
                    calls[len(merged) - 1] = self.call_origins[k]
        self.origins, self.call_origins = origins, calls
        return merged

    def _tools(self, f: Fields) -> list[dict] | None:
        tools = f.list("tools")
        if not tools:
            return None
        out = []
        for i, tool in enumerate(tools):
            tf = Fields(tool, f"tools[{i}]")
            kind = tf.str("type")
            if kind not in (None, "custom"):
                raise tf.error("type", f"server tool {kind!r} is not supported: give custom tools with an "
                                       "input_schema")
            schema = tf.object("input_schema")
            # OpenAI's key order (name, description, parameters): the template writes each tool as JSON, so
            # the same tools sent through either API render the same prompt and share its reuse
            name = tf.str("name", max_chars=256)
            if name and breaks_call_markup(name):
                raise tf.error("name", f"{name[:64]!r} holds whitespace, '<' or '>' (a name is written inside "
                                       "the call's markup); Anthropic's names are [a-zA-Z0-9_-]")
            fn = {"name": name}
            if tf.has("description"):
                fn["description"] = tf.str("description")
            fn["parameters"] = schema.obj if schema is not None else {"type": "object"}
            if tf.bool("strict"):  # Anthropic's strict tool use: the call's input follows input_schema
                fn["strict"] = True
            out.append({"type": "function", "function": fn})
        return out

    def _tool_choice(self, f: Fields) -> object:
        choice = f.object("tool_choice")
        if choice is None:
            return None
        self.parallel = not choice.bool("disable_parallel_tool_use")
        kind = choice.str("type", choices=("auto", "any", "tool", "none"))
        if kind == "tool":
            return {"type": "function", "function": {"name": choice.str("name") or ""}}
        return {"auto": "auto", "any": "required", "none": "none", None: None}[kind]

    def _output_format(self, f: Fields) -> dict | None:
        """Anthropic's structured outputs, ``output_config.format`` (or the beta's top-level ``output_format``):
        a ``json_schema`` format becomes chat's strict ``response_format``."""
        config = f.object("output_config")
        if config is not None:
            config.str("effort", choices=EFFORTS)
        fmt, self.format_field = (config.object("format"), "output_config.format") if config is not None else (None, "")
        if fmt is not None:
            f.passed_over("output_format")  # the beta's spelling loses to output_config.format
        elif f.has("output_format"):
            fmt, self.format_field = f.object("output_format"), "output_format"
        if fmt is None:
            return None
        if fmt.str("type", choices=("json_schema",)) is None:
            raise fmt.error("type", "is required")
        schema = fmt.object("schema")
        if schema is None:
            raise fmt.error("schema", "is required")
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema.obj, "strict": True}}

    def translate(self, body: dict, *, counting: bool = False) -> dict:
        """The chat completions body of a Messages body (``counting``: for count_tokens, no max_tokens)."""
        f = self.fields = Fields(body)
        f.read.update(PASSED)  # read on the chat path
        if not counting and f.int("max_tokens", None, 1) is None:
            raise f.error("max_tokens", "is required")
        if f.has("mcp_servers"):
            raise f.error("mcp_servers", "is not supported")
        chat: dict = {k: body[k] for k in PASSED if body.get(k) is not None}
        chat["messages"] = self._messages(f)
        if chat["messages"] and chat["messages"][-1]["role"] == "assistant":
            chat["continue_final_message"] = True  # Anthropic's prefill: the answer writes on from it
        stops = f.list("stop_sequences")
        if stops:
            chat["stop"] = stops
        tools = self._tools(f)
        if tools:
            chat["tools"] = tools
        choice = self._tool_choice(f)
        if choice is not None:
            chat["tool_choice"] = choice
        if not self.parallel:  # a required call's grammar then ends after one call
            chat["parallel_tool_calls"] = False
        output_format = self._output_format(f)
        if output_format is not None and tools and chat.get("tool_choice") != "none":
            # one grammar cannot hold both "a call" and "JSON under the schema" as the whole answer: the
            # tools stay callable and the format is not enforced (logged once; docs/api.md says so)
            _warn_format_with_tools()
            self.notes.append("output_config.format not enforced (callable tools)")
        elif output_format is not None:
            chat["response_format"] = output_format
        thinking = f.object("thinking")
        if thinking is not None:
            kind = thinking.str("type", choices=("enabled", "disabled", "adaptive"))
            chat["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
            budget = thinking.int("budget_tokens", None, 1)
            if kind == "enabled" and budget is not None:
                chat["thinking_token_budget"] = budget
        return chat

    def make_response(self, p: CommonParams, tokenizer: TextTokenizer, head: dict) -> MessagesResponse:
        return MessagesResponse(p, tokenizer, head, self.parallel)

    def remap(self, e: ApiError) -> ApiError:
        """``e`` naming the Anthropic field a chat message or field came from."""
        param = e.param or ""
        m = re.fullmatch(r"messages\[(\d+)\](.*)", param)
        if m and int(m.group(1)) < len(self.origins):
            index, tail = int(m.group(1)), m.group(2)
            call = re.fullmatch(r"\.tool_calls\[(\d+)\]\.function\.(name|arguments)(.*)", tail)
            blocks = self.call_origins.get(index, [])
            if call and int(call.group(1)) < len(blocks):  # a tool_use block's field
                field = "name" if call.group(2) == "name" else "input"
                return e.renamed(f"{blocks[int(call.group(1))]}.{field}{call.group(3)}")
            tail = ".tool_use_id" if tail == ".tool_call_id" else tail  # the field as Anthropic names it
            return e.renamed(self.origins[index] + tail)
        if param.startswith("response_format") and self.format_field:
            return e.renamed(self.format_field + ".schema")
        return e.renamed({"stop": "stop_sequences", "tool_choice.function.name": "tool_choice.name",
                          "thinking_token_budget": "thinking.budget_tokens"}.get(param, param))


class MessagesRequest(GenerationRequest):
    """A Messages request on the chat path; streamed, its head goes out early when the first answer is slow
    (``messages_output.EarlyStart``)."""

    async def answer_prompts(self, endpoint: str, rid: str, prompts: list[tuple[list[int], int]],
                             response: MessagesResponse, **kw) -> web.StreamResponse:
        if not self.params.stream:
            return await super().answer_prompts(endpoint, rid, prompts, response, **kw)
        early = response.early = EarlyStart(self.http)
        self.on_sent = lambda gen: early.arm(lambda: response.opening(gen.usage))
        try:
            return await super().answer_prompts(endpoint, rid, prompts, response, **kw)
        except (ApiError, EngineFailed, EngineUnavailable) as exc:
            if early.resp is None:  # nothing sent: the HTTP status says it
                raise
            return await early.fail(exc)
        finally:
            await early.settle()


def _keep_request_id(http: web.Request, turn: MessagesTurn) -> None:
    """The request's id: the client's ``X-Request-Id``, else the message's id (what the log names)."""
    try:
        client = client_request_id(http, Fields({}))
    except ApiError:
        client = None  # a bad header: answered as a 400 later, in the generation's own checks
    http[REQUEST_ID] = client or turn.rid
    remember(http, client or turn.rid)


async def create_message(request: web.Request) -> web.StreamResponse:
    """Create a message (Anthropic's Messages API)."""
    turn = MessagesTurn()
    _keep_request_id(request, turn)
    try:
        req = await MessagesRequest.read(request, "chat", translate=turn.translate)
        req.notes += turn.notes
        req.body_fields = turn.fields
        return await answer_chat(req, ENDPOINT, turn.rid, turn.make_response)
    except ApiError as e:
        raise turn.remap(e) from None


async def count_tokens(request: web.Request) -> web.Response:
    """Count the input tokens of a message request."""
    turn = MessagesTurn()
    _keep_request_id(request, turn)
    try:
        chat = turn.translate(await read_request_body(request), counting=True)
        gw: GatewayState = request.app[STATE].select(chat.get("model"))
        ids = await prompt_work(request).run(render_chat_ids, gw, Fields(chat), True)
    except ApiError as e:
        raise turn.remap(e) from None
    return json_response({"input_tokens": len(ids)})


def _empty(content: object) -> bool:
    """An assistant turn with nothing in it: no text (empty text blocks only), no call, no thinking."""
    if isinstance(content, str):
        return not content
    return isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and not b.get("text") for b in content)


def _parts(content: object) -> list:
    """A user turn's content as a list of parts."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
