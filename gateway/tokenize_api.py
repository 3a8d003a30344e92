"""POST /tokenize, POST /detokenize and GET /tokenizer_info: vLLM's token utilities, on the served model's
tokenizer and template.

/tokenize takes one of

- ``prompt`` (text) with ``add_special_tokens`` (default true), tokenized as
  /v1/completions tokenizes a text prompt;
- ``messages`` (with ``tools``, ``chat_template_kwargs``,
  ``add_generation_prompt`` default true, ``continue_final_message``,
  ``add_special_tokens`` default false), rendered by the model's chat template as /v1/chat/completions
  renders them (developer turns placed by the same policy), so ``count`` is
  the prompt a chat request of those fields would send. Image parts are a
  400: their token count depends on the picture, which is not fetched here.

and answers ``{"count", "max_model_len", "tokens"}``, plus ``token_strs``
(each token's vocabulary string) with ``return_token_strs``. /detokenize
takes ``tokens`` (ids inside the vocabulary) and answers ``{"prompt"}``, the
text with special tokens kept. ``model`` picks the served model as
elsewhere. /tokenizer_info (served with ``--enable-tokenizer-info-endpoint``:
it shows the chat template) answers the tokenizer's configuration as
tokenizer_config.json holds it, special tokens as their text, with
``tokenizer_class`` and the chat template the gateway renders with: what
lm-eval's remote tokenizer reads, with /tokenize and /detokenize, to evaluate a
served model without fetching its tokenizer. All three sit under the API key
like /v1 routes.
"""

from __future__ import annotations

from aiohttp import web

from ignis.gateway.chat import rendering_errors, template_kwargs, with_suffix
from ignis.gateway.continuation import continued_text
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.generation_request import read_request_body
from ignis.gateway.messages import (
    apply_developer_policy,
    check_tool_results,
    image_urls,
    parse_messages,
    parse_tool_choice,
    parse_tools,
    prompt_tools,
)
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.prompt_work import prompt_work
from ignis.gateway.responses import json_response
from ignis.gateway.state import STATE, GatewayState
from ignis.gateway.tool_call_format import forced_call_suffix, resolve_format
from ignis.gateway.tool_call_split import forced_call as forced_call_of



def render_chat_ids(gw: GatewayState, f: Fields, forced_call: bool = False) -> list[int]:
    """The prompt ids of a chat-shaped body's ``messages``, ``tools`` and template kwargs; ``forced_call``:
    with the call opener a required or named ``tool_choice`` ends the prompt with, as the chat path sends it
    (Anthropic's count_tokens counts it; vLLM's /tokenize renders the template alone)."""
    if gw.template is None:
        raise invalid("this model has no chat template; tokenize a prompt instead", "messages",
                      code="no_chat_template")
    continuing = f.bool("continue_final_message")
    if continuing and f.bool("add_generation_prompt", False):
        raise f.error("add_generation_prompt", "cannot be true with continue_final_message")
    messages = parse_messages(f)
    check_tool_results(messages)  # the chat path's refusal: no count for a conversation it would not serve
    if image_urls(messages):
        raise f.error("messages", "image parts cannot be tokenized here (their token count depends on the "
                                  "picture); send the text parts alone")
    messages = apply_developer_policy(messages, gw.config.server_developer_message_policy,
                                      gw.template.takes_late_system)
    tools = parse_tools(f)
    choice = parse_tool_choice(f, tools)
    rendered = prompt_tools(tools, choice, gw.config.exclude_tools_when_tool_choice_none)
    if forced_call and forced_call_of(choice, tools) is not None and not continuing:
        with rendering_errors():
            prompt = build_chat_prompt(gw.template, gw.tokenizer, messages, rendered, template_kwargs(f))
        fmt = resolve_format(gw.config.tool_call_parser, gw.template.source)
        return with_suffix(gw.tokenizer, prompt, forced_call_suffix(fmt, choice.name, prompt.starts_in_reasoning))
    tools = rendered
    with rendering_errors():
        if continuing:
            text = continued_text(gw.template, messages, tools, template_kwargs(f))
        else:
            text = gw.template.render(messages, tools,
                                      add_generation_prompt=f.bool("add_generation_prompt", True),
                                      extra=template_kwargs(f))
    return gw.tokenizer.encode(text, add_special_tokens=f.bool("add_special_tokens", False))


def _tokenize(gw: GatewayState, f: Fields) -> list[int]:
    if f.has("messages") == f.has("prompt"):
        raise invalid("give either 'prompt' or 'messages'", "prompt" if f.has("prompt") else "messages")
    if f.has("messages"):
        return render_chat_ids(gw, f)
    return gw.tokenizer.encode(f.str("prompt"), add_special_tokens=f.bool("add_special_tokens", True))


async def tokenize(request: web.Request) -> web.Response:
    """The token ids of a prompt or a rendered conversation."""
    f = Fields(await read_request_body(request))
    gw: GatewayState = request.app[STATE].select(f.str("model", None, max_chars=256))
    want_strs = f.bool("return_token_strs")
    ids = await prompt_work(request).run(_tokenize, gw, f)
    body = {"count": len(ids), "max_model_len": gw.client.stats_values.get("max_model_len"), "tokens": ids}
    if want_strs:
        body["token_strs"] = gw.tokenizer.token_strings(ids)
    return json_response(body)


async def detokenize(request: web.Request) -> web.Response:
    """The text of token ids."""
    f = Fields(await read_request_body(request))
    gw: GatewayState = request.app[STATE].select(f.str("model", None, max_chars=256))
    ids = f.list("tokens", required=True)
    vocab = gw.tokenizer.vocab_size
    for t in ids:
        if type(t) is not int or not 0 <= t < vocab:
            raise f.error("tokens", f"must be token ids in [0, {vocab}), got {t!r}")
    text = await prompt_work(request).run(gw.tokenizer.decode, ids, False)
    return json_response({"prompt": text})


def _as_text(value):
    """A config value with each added-token object (``{"content": ..., ...}``) as its text."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    return value


def tokenizer_info_body(gw: GatewayState) -> dict:
    """tokenizer_config.json's settings (not its added-token table nor its templates), special tokens as text,
    ``tokenizer_class``, and the chat template this gateway renders with."""
    body = {k: _as_text(v) for k, v in gw.tokenizer.config.items()
            if k not in ("added_tokens_decoder", "chat_template") and v is not None}
    body.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    body.update(gw.tokenizer.special_tokens_map())
    if gw.template is not None:
        body["chat_template"] = gw.template.source
    return body


async def tokenizer_info(request: web.Request) -> web.Response:
    """The tokenizer's configuration and chat template."""
    gw: GatewayState = request.app[STATE].select(request.query.get("model"))
    return json_response(tokenizer_info_body(gw))
