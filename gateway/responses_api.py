"""POST /v1/responses (and GET / DELETE /v1/responses/{id}): OpenAI's Responses API on the chat path.

A request body is translated into a chat completions body, which then takes
the chat path unchanged (``chat.answer_chat``: request model, developer
policy, chat template, capture marks, tool-call and reasoning parsers,
grammars, usage); only the answer's shape differs (gateway.responses_events)::

    instructions                  leading messages: a string is a system message, an array is items
                                  (not carried over by previous_response_id)
    input                         messages (gateway.responses_items)
    previous_response_id          the stored conversation first; unknown or expired: 404
    tools, tool_choice            gateway.responses_tools
    parallel_tool_calls: false    only the first call is answered
    text.format                   response_format (json_schema, json_object, text)
    reasoning.effort              chat_template_kwargs.enable_thinking: false for none / minimal, else true
    max_output_tokens             max_tokens
    temperature, top_p            as given (also seed, top_k, min_p, penalties, request_class: ignis extensions)
    prompt_cache_key              as given: a conversation family, a hint for ranking retained entries
    cache_salt                    as given: reuse only among requests with the same salt (vLLM's)
    include reasoning.encrypted_content   reasoning items carry a blob (gateway.reasoning_seal)
    store (default true)          the turn is kept (gateway.responses_store) for previous_response_id
    metadata                      echoed
    client_metadata, user, safety_identifier, service_tier, truncation, ...
                                  ignored

A 400 raised on the chat path names the Responses field it came from
(``input[3]``, ``text.format.schema``, ``max_output_tokens``, ``tools[2].tools[0]``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ignis.gateway.chat import answer_translated
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.params import CommonParams
from ignis.gateway.reasoning_effort import EFFORTS, with_effort
from ignis.gateway.reasoning_seal import ReasoningSeal
from ignis.gateway.responses import json_response
from ignis.gateway.responses_events import ResponsesResponse
from ignis.gateway.responses_items import Conversation, stored_call_ids, translate_input, translate_instructions
from ignis.gateway.responses_output import OutputItems, item_id
from ignis.gateway.responses_store import ResponseStore
from ignis.gateway.responses_tools import ToolNames, translate_tool_choice, translate_tools
from ignis.gateway.state import STATE, GatewayState
from ignis.gateway.tokenizer import TextTokenizer

log = logging.getLogger("ignis.gateway")

ENDPOINT = "responses"
RESPONSES = web.AppKey("ignis_responses", object)
BLOB_INCLUDE = "reasoning.encrypted_content"
PASSED = ("model", "temperature", "top_p", "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "request_class", "prompt_cache_key", "cache_salt")
"""Fields handed to the chat path as they are (same names, same checks)."""
KNOWN_HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use",
                "computer_use_preview", "mcp", "image_generation", "local_shell", "shell", "custom",
                "apply_patch", "tool_search")
"""Tool types counted by name in the ignored-tools metric; any other is counted as "other"."""


@dataclass
class ResponsesState:
    store: ResponseStore
    seal: ReasoningSeal


def responses_state(runtime_dir: str | Path, instance: str) -> ResponsesState:
    return ResponsesState(ResponseStore(), ReasoningSeal(Path(runtime_dir) / f"{instance}-reasoning.key"))


def _not_found(rid: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"no stored response {rid!r}: it was never stored (store: false), has expired, or this "
                         f"server restarted since; send the whole conversation as input instead",
                    param=param, code="response_not_found", type="invalid_request_error")


class ResponsesTurn:
    """One /v1/responses request: its body as a chat body, and the answer's shape."""

    def __init__(self, http: web.Request):
        self.gw: GatewayState = http.app[STATE]
        self.state: ResponsesState = http.app[RESPONSES]
        self.rid = item_id("resp")
        self.origins: list[str] = []
        self.names = ToolNames()
        self.conversation = Conversation()
        self.echo: dict = {}
        self.store = True
        self.blob = False
        self.parallel = True

    # ----- the body --------------------------------------------------------------------

    def _ignored(self, kind: str | None) -> None:
        label = kind if kind in KNOWN_HOSTED else "other"
        log.warning("/v1/responses: tool type %r left out (this server cannot run it)", kind)
        self.gw.metrics.tool_ignored(label)

    def _text_format(self, f: Fields) -> dict | None:
        text = f.object("text")
        fmt = text.object("format") if text is not None else None
        if fmt is None:
            return None
        kind = fmt.str("type", choices=("text", "json_object", "json_schema"))
        if kind is None:
            raise fmt.error("type", "is required")
        if kind != "json_schema":
            return {"type": kind}
        spec = {k: fmt.raw(k) for k in ("name", "schema", "strict") if fmt.raw(k) is not None}
        return {"type": "json_schema", "json_schema": spec}

    def _template_kwargs(self, f: Fields) -> dict:
        kwargs = dict(f.object("chat_template_kwargs").obj) if f.has("chat_template_kwargs") else {}
        reasoning = f.object("reasoning")
        effort = reasoning.str("effort", choices=EFFORTS) if reasoning is not None else None
        kwargs = with_effort(kwargs, effort)
        self.echo["reasoning"] = {"effort": effort,
                                  "summary": reasoning.str("summary") if reasoning is not None else None}
        return kwargs

    def _earlier(self, f: Fields) -> Conversation:
        prev = f.str("previous_response_id", max_chars=256)
        if prev is None:
            return Conversation()
        entry = self.state.store.get(prev)
        if entry is None:
            raise _not_found(prev, "previous_response_id")
        messages = list(entry.messages)
        return Conversation(messages, ["previous_response_id"] * len(messages), stored_call_ids(messages))

    def translate(self, body: dict) -> dict:
        """The chat completions body of a Responses body."""
        f = Fields(body)
        if f.bool("background"):
            raise f.error("background", "is not supported: responses are answered while the request waits")
        if f.has("conversation"):
            raise f.error("conversation", "is not supported; use previous_response_id or send the input")
        include = f.list("include") or []
        self.blob = BLOB_INCLUDE in include
        self.store = f.bool("store", True)
        self.parallel = f.bool("parallel_tool_calls", True)
        tools, self.names = translate_tools(f, self._ignored)
        choice = translate_tool_choice(f, self.names)
        earlier = self._earlier(f)
        self.conversation = translate_input(f, self.names, self.state.seal, earlier)
        lead = translate_instructions(f, self.names, self.state.seal)
        self.origins = lead.origins + self.conversation.origins
        metadata = f.object("metadata")
        chat: dict = {k: body[k] for k in PASSED if body.get(k) is not None}
        chat.update(messages=lead.messages + self.conversation.messages, stream=f.bool("stream"))
        max_output = f.int("max_output_tokens", None, 1)
        if max_output is not None:
            chat["max_tokens"] = max_output
        fmt = self._text_format(f)
        if fmt is not None:
            chat["response_format"] = fmt
        kwargs = self._template_kwargs(f)
        if kwargs:
            chat["chat_template_kwargs"] = kwargs
        if tools:
            chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
        self.echo.update(
            instructions=f.raw("instructions"), metadata=metadata.obj if metadata is not None else {},
            parallel_tool_calls=self.parallel, tool_choice=f.raw("tool_choice") or "auto",
            tools=f.raw("tools") or [], max_output_tokens=max_output, previous_response_id=f.raw("previous_response_id"), store=self.store,
            text={"format": (f.object("text").raw("format") if f.has("text") else None) or {"type": "text"}},
            truncation="disabled", prompt_cache_key=f.raw("prompt_cache_key"))
        return chat

    # ----- the answer ------------------------------------------------------------------

    def make_response(self, p: CommonParams, tokenizer: TextTokenizer, head: dict) -> ResponsesResponse:
        seal = self.state.seal.seal if self.blob else None
        items = OutputItems(self.names, self.parallel, seal)
        self.echo.update(temperature=p.temperature, top_p=p.top_p)  # as sampled: the request's, else the model's
        return ResponsesResponse(p, tokenizer, head, items, self.echo, self._done)

    def _done(self, response: dict, turn: dict) -> None:
        if self.store:
            self.state.store.put(self.rid, self.conversation.messages + [turn], response)

    def remap(self, e: ApiError) -> ApiError:
        """``e`` with a chat field in ``param`` (and its message) named as the Responses field."""
        param = e.param
        if param is None:
            return e
        new = param
        m = re.fullmatch(r"messages\[(\d+)\].*", param)
        t = re.fullmatch(r"tools\[(\d+)\].*", param)
        if m and int(m.group(1)) < len(self.origins):
            new = self.origins[int(m.group(1))]
        elif t and int(t.group(1)) < len(self.names.origins):
            new = self.names.origins[int(t.group(1))]
        elif param == "messages":
            new = "input"
        elif param.startswith("response_format"):
            new = "text.format" + param[len("response_format"):].replace(".json_schema", "", 1)
        elif param == "max_tokens":
            new = "max_output_tokens"
        elif param == "tool_choice.function.name":
            new = "tool_choice.name"
        return e.renamed(new)


async def create_response(request: web.Request) -> web.StreamResponse:
    """Create a model response (OpenAI's Responses API)."""
    return await answer_translated(request, ResponsesTurn(request), ENDPOINT)


async def get_response(request: web.Request) -> web.Response:
    """A stored response (``store: true``) by id."""
    rid = request.match_info["response_id"]
    entry = request.app[RESPONSES].store.get(rid)
    if entry is None:
        raise _not_found(rid)
    return json_response(entry.response)


async def delete_response(request: web.Request) -> web.Response:
    """Forget a stored response."""
    rid = request.match_info["response_id"]
    if not request.app[RESPONSES].store.delete(rid):
        raise _not_found(rid)
    return json_response({"id": rid, "object": "response.deleted", "deleted": True})
