"""One request of either completion endpoint, from its body to its last byte: the part both share.

/v1/chat/completions and /v1/completions differ in how they make a prompt and
in what a choice looks like (an ``EndpointResponse``); the rest is here, once:

    GenerationRequest.read()    the body (bounded in bytes and time, gateway.body), its cheap checks
                                (gateway.request_limits), the common fields, the model asked for
    GenerationRequest.answer()  one Generate and one ChoiceState per choice, the
                                engine streams opened, then SSE chunks or one
                                JSON body, with usage and prompt_token_ids

Invariants: the active-streams gauge is up exactly while the engine streams
are; time to first token is observed once every choice has its first answer;
streamed tokens are counted as they are sent, a body's once it is complete.
Every streamed choice and every body choice gets ``token_ids`` last, when asked.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from ignis.gateway.body import parse_object, read_body
from ignis.gateway.choice import ChoiceDelta, ChoiceState
from ignis.gateway.errors import ApiError, invalid
from ignis.gateway.fields import Fields
from ignis.gateway.generation import Generation, Usage
from ignis.gateway.ignored_fields import report_unread
from ignis.gateway.output_parser import OutputParser
from ignis.gateway.params import CommonParams, parse_common, sampling_for
from ignis.gateway.prompt_work import prompt_work
from ignis.gateway.request_ids import client_request_id, engine_base, remember
from ignis.gateway.request_limits import RequestLimits, check_body
from ignis.gateway.responses import json_response, sse, sse_skeleton, stream_sse
from ignis.gateway.state import STATE, GatewayState
from ignis.gateway.structured_outputs import LEGACY
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.image_input import ImageInput
from ignis.shared.wire import MAX_NOTE_CHARS, Generate


_INLINE_BODY_BYTES = 256 << 10
GRAMMAR_FIELDS = ("response_format", "structured_outputs", *LEGACY)
"""Fields that make a grammar: the library checks it in tens of milliseconds (releasing the GIL), so a body
naming one has its fields read on a worker thread, never on the event loop the streams share."""
PROMPT_FIELDS = {"chat": "messages", "completions": "prompt", "responses": "input", "messages": "messages"}
"""The field that holds the prompt, by endpoint (named by a context-length error)."""


GRAMMAR_PARAMS = (*GRAMMAR_FIELDS, "text", "output_format", "tool_choice", "tools")
"""Where a request's grammar came from, in order (structured output, a responses ``text`` format, Anthropic's
``output_format``, a forced tool call): an engine refusal of the grammar names the first field present."""


def grammar_param(fields: Fields | None) -> str | None:
    """The field of ``fields`` (the request's, as the client sent them) that made its grammar."""
    body = fields.obj if fields is not None else {}
    return next((name for name in GRAMMAR_PARAMS if body.get(name) is not None), None)


def _checked_body(raw: bytes, limits: RequestLimits) -> dict:
    body = parse_object(raw)
    check_body(body, limits)
    return body


async def read_request_body(http: web.Request) -> dict:
    """The JSON object of a request body, within the context-sized limits (``gateway.request_limits``); read
    once per request (a route that looks at the body before handing the request on reads it again here)."""
    if _BODY in http:
        return http[_BODY]
    http[_BODY] = body = await _read_request_body(http)
    return body


_BODY = web.RequestKey("ignis_body", dict)


async def _read_request_body(http: web.Request) -> dict:
    gw: GatewayState = http.app[STATE]
    limits = RequestLimits.of(gw)
    raw = await read_body(http, limits.body_bytes, gw.config.body_read_timeout)
    if len(raw) > _INLINE_BODY_BYTES:  # parsing and walking a big body: off the event loop
        return await prompt_work(http).run(_checked_body, raw, limits)
    return _checked_body(raw, limits)


class EndpointResponse:
    """What one endpoint's choices look like, streamed and in one body; each endpoint subclasses it.

    ``body_head`` and ``chunk_head`` are the keys (id, object, created, model)
    that open the one JSON body and every SSE chunk.
    """

    prompt_ids_per_choice = False
    """With ``return_token_ids``, each choice carries its prompt's ids too (vLLM's completions)."""

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, body_head: dict, chunk_head: dict):
        self.params = params
        self.tokenizer = tokenizer
        self.body_head = body_head
        self.chunk_head = chunk_head

    def opened(self, gen: Generation) -> None:
        """Every choice has its first answer, and with it its prompt scores, if asked
        (``ChoiceState.prompt_scores``); called before any delta is taken."""
        scored = {}  # a prompt's scores come with its first choice (``answer_prompts`` asks that one only)
        for c in gen.choices:
            scored.setdefault(c.prompt_index, c.prompt_scores)
        self.prompts = [(m.prompt_ids, scored[c.prompt_index]) for m, c in zip(gen.messages, gen.choices)]

    def first_choices(self) -> list[dict]:
        """The choices of the SSE chunk sent before any token; none: no such chunk."""
        return []

    def first_extra(self) -> dict:
        """Top-level keys of that first chunk (it is sent for them even without choices)."""
        return {}

    def chunk_choice(self, d: ChoiceDelta) -> dict:
        """One streamed choice; called only for a delta with something to send."""
        raise NotImplementedError

    def chunk_choice_bytes(self, d: ChoiceDelta) -> bytes:
        """``chunk_choice`` as JSON (an endpoint may write its common case without the dict)."""
        return orjson.dumps(self.chunk_choice(d))

    def take(self, d: ChoiceDelta) -> None:
        """One body: add a delta to its choice."""
        raise NotImplementedError

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        """One choice of the body, once every delta has been taken."""
        raise NotImplementedError

    def body(self, choices: list[dict], usage: Usage) -> dict:
        """The one JSON body (``choices`` from ``body_choice``)."""
        return dict(self.body_head, choices=choices, usage=usage.to_json())

    async def stream(self, http: web.Request, gen: Generation, on_tokens: Callable[[int], None],
                     buffer_limit: int, on_stall: Callable[[], None]) -> web.StreamResponse | None:
        """A streamed answer in the endpoint's own event format; None: chat-style ``data:`` chunks.
        ``buffer_limit`` and ``on_stall``: as ``stream_sse``'s."""
        return None


def _within_max_logprobs(f: Fields, p: CommonParams, most: int, kind: str) -> None:
    """A request asking for more alternatives per token than ``--max-logprobs`` allows is a 400 naming the field."""
    top = "logprobs" if kind == "completion" else "top_logprobs"
    for name, value in ((top, p.top_logprobs), ("prompt_logprobs", p.prompt_logprobs)):
        if value is not None and value > most:
            raise f.error(name, f"must be at most {most} (the server's --max-logprobs), got {value}")


@dataclass
class GenerationRequest:
    """A request whose common fields are parsed, its model chosen."""

    http: web.Request
    gw: GatewayState  # the state of the model asked for
    fields: Fields
    params: CommonParams
    started: float  # time.monotonic() when the request arrived
    client_id: str | None = None
    """The client's id for the request (``X-Request-Id`` or ``request_id``; ``gateway.request_ids``)."""
    detached: bool = False
    """The generation goes on when the HTTP client goes (a background response's)."""
    on_sent: Callable[[Generation], None] | None = None
    """Called once the engine requests are about to be sent, with their ``Generation`` (its ``usage`` grows
    as the engine answers): the prompt is made, nothing more can be a 400."""
    fit_context: bool = False
    """A chat past the context loses its earliest turns instead of failing (the Responses API's
    ``truncation: "auto"``; ``gateway.conversation_fit``)."""
    scoring_only: bool = False
    """Every choice shows its prompt only (``echo`` with ``max_tokens`` 0): one token is generated, unshown."""
    translated: bool = False
    """The body was another endpoint's, turned into this one's (``fields`` are the chat body made of it)."""
    body_fields: Fields | None = None
    """For a translated request, the client's body as sent (its endpoint sets it): the fields it carried
    that nothing read are reported from it once the request is about to be sent."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What could not be honoured for this request (a schema held leniently, a hosted tool left out, a format
    not enforced): each is also logged (once) and counted where it happens; the engine's done line names
    them (``Generate.notes``)."""

    @classmethod
    async def read(cls, http: web.Request, kind: str,
                   translate: Callable[[dict], dict] | None = None) -> GenerationRequest:
        """``kind``: "chat" or "completion", for the fields only one endpoint has; ``translate`` turns
        another endpoint's body (checked within the same limits) into a chat-shaped one first."""
        gw: GatewayState = http.app[STATE]
        started = time.monotonic()
        body = await read_request_body(http)
        if translate is not None:
            body = translate(body)
        f = Fields(body)
        if any(body.get(name) is not None for name in GRAMMAR_FIELDS):
            p = await prompt_work(http).run(parse_common, f, http.headers, kind)
        else:
            p = parse_common(f, http.headers, kind)
        served = gw.select(p.model)
        _within_max_logprobs(f, p, gw.config.max_logprobs, kind)
        p = p.for_model(f, served.tokenizer, served.sampling_defaults)
        if gw.config.scheduling_policy == "fcfs":
            p = p.first_come(f)
        return cls(http, served, f, p, started, client_request_id(http, f), translated=translate is not None)

    def _notes(self) -> str | None:
        text = "; ".join(dict.fromkeys(self.notes))
        return (text if len(text) <= MAX_NOTE_CHARS else text[:MAX_NOTE_CHARS - 3] + "...") or None

    async def answer(self, endpoint: str, rid: str, prompt_ids: list[int], max_tokens: int,
                     response: EndpointResponse, *, marks: dict | None = None,
                     parser: Callable[[], OutputParser] | None = None,
                     images: tuple[ImageInput, ...] = ()) -> web.StreamResponse:
        """Generate ``n`` choices of ``prompt_ids`` and answer; ``marks`` are the Generate's capture
        marks, ``parser`` makes each choice's output parser (none: the text is all content), ``images``
        the prompt's resized pictures (one per run of pad tokens, in order)."""
        return await self.answer_prompts(endpoint, rid, [(prompt_ids, max_tokens)], response, marks=marks,
                                         parser=parser, images=images)

    async def answer_prompts(self, endpoint: str, rid: str, prompts: list[tuple[list[int], int]],
                             response: EndpointResponse, *,
                             marks: dict | Callable[[list[int]], dict] | None = None,
                             parser: Callable[[], OutputParser] | None = None,
                             images: tuple[ImageInput, ...] = ()) -> web.StreamResponse:
        """``answer`` for several ``(prompt ids, max_tokens)``: ``n`` choices each, prompt k's j-th choice
        at index ``k * n + j`` with choice j's seed; usage sums the prompts; ``prompt_token_ids`` is one
        list per prompt when there are several. ``marks``: the same for every prompt, or each prompt's
        from its ids."""
        gw, p = self.gw, self.params
        for _, max_tokens in prompts:
            if p.min_tokens > max_tokens:  # the budget the context (or the default) left: vLLM's check
                raise invalid(f"min_tokens ({p.min_tokens}) is more than the tokens this request may generate "
                              f"({max_tokens}: max_tokens, or the model's default, or the context left)",
                              "min_tokens")
        sent = self.body_fields if self.translated else self.fields
        if sent is not None:  # the prompt is made: the request is answered, so what it carried unread is said
            report_unread(sent, endpoint, gw.metrics, self.notes)
        remember(self.http, self.client_id or rid)
        base = engine_base(rid, self.client_id)
        gens, choices = [], []
        for k, (ids, max_tokens) in enumerate(prompts):
            prompt_marks = marks(ids) if callable(marks) else marks
            for j in range(p.n):
                i = k * p.n + j
                sampling = sampling_for(p, max_tokens, j)
                if j and sampling.prompt_logprobs is not None:  # a prompt is scored once, by its first choice
                    sampling = dataclasses.replace(sampling, prompt_logprobs=None)
                gens.append(Generate(id=f"{base}-{i}", prompt_ids=tuple(ids), sampling=sampling,
                                     request_class=p.request_class, model=gw.engine_model, grammar=p.grammar,
                                     cache_family=p.cache_family, cache_salt=p.cache_salt, adapter=gw.adapter,
                                     images=images, notes=self._notes(),
                                     **(prompt_marks or {})))
                choices.append(ChoiceState(i, gw.tokenizer, stops=p.stops, stop_token_ids=p.stop_token_ids,
                                           parser=parser() if parser is not None else None,
                                           min_tokens=p.min_tokens, prompt_index=k,
                                           include_stop=p.include_stop_str_in_output,
                                           skip_special_tokens=p.skip_special_tokens, ignore_eos=p.ignore_eos,
                                           scoring_only=self.scoring_only))
        prompt_ids = list(prompts[0][0]) if len(prompts) == 1 else [list(ids) for ids, _ in prompts]
        gw.metrics.active.inc()
        try:
            async with Generation(gw.client, gens, choices, self._client_gone) as gen:
                if self.on_sent is not None:
                    self.on_sent(gen)
                try:
                    await gen.open()
                except ApiError as e:  # the engine's refusal: a prompt past its context names the endpoint's field
                    if e.code == "context_length_exceeded":
                        e.param = PROMPT_FIELDS.get(endpoint, e.param)
                    elif e.status == 400 and e.param is None and p.grammar is not None:
                        e.param = grammar_param(sent)  # its grammar did not compile: the field that made it
                    raise
                gw.metrics.first_token(endpoint, time.monotonic() - self.started)
                response.opened(gen)
                if p.stream:
                    own = await response.stream(self.http, gen, gw.metrics.tokens.inc,
                                                gw.config.stream_buffer_bytes, gw.metrics.stalled.inc)
                    if own is not None:
                        return own
                    return await self._stream(gen, response, prompt_ids)
                return await self._one_body(gen, response, prompt_ids)
        finally:
            gw.metrics.active.dec()

    def _client_gone(self) -> bool:
        if self.detached:
            return False
        transport = self.http.transport
        return transport is None or transport.is_closing()

    async def _stream(self, gen: Generation, response: EndpointResponse, prompt_ids) -> web.StreamResponse:
        p, head = self.params, response.chunk_head
        extra = {"usage": None} if p.include_usage else {}
        first, first_extra = response.first_choices(), response.first_extra()
        prelude = [dict(head, choices=first, **extra, **first_extra)] if first or first_extra else []
        if p.return_token_ids and prelude:
            prelude[0]["prompt_token_ids"] = prompt_ids
        elif p.return_token_ids:
            prelude = [dict(head, choices=[], prompt_token_ids=prompt_ids, **extra)]
        if p.continuous_usage and prelude:
            n = gen.usage.prompt_tokens
            prelude[0]["usage"] = {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}
        wants_tokens = p.return_token_ids or p.logprobs
        # Every chunk is the head's keys, one choice, and the usage key when asked: serialised once, then only
        # the choice is spliced in per delta (the bytes orjson makes of the whole dict).
        open_, close = sse_skeleton(head, "choices", extra)
        open_, close = open_ + b"[", b"]" + close

        prompt_lens = [len(m.prompt_ids) for m in gen.messages]
        generated = [0] * len(prompt_lens)  # per choice, for continuous usage
        # vLLM's completions give each choice its prompt's ids, in the choice's first chunk
        unsent = set(range(len(prompt_lens))) if p.return_token_ids and response.prompt_ids_per_choice else set()

        def chunk_of(d: ChoiceDelta) -> bytes | None:
            generated[d.index] += len(d.token_ids)
            if not (d.has_text or d.finish_reason or (wants_tokens and d.token_ids)):
                return None
            choice = response.chunk_choice_bytes(d)
            if p.return_token_ids:
                choice = choice[:-1] + b',"token_ids":' + orjson.dumps(d.token_ids) + b"}"
            if d.index in unsent:
                unsent.discard(d.index)
                choice = choice[:-1] + b',"prompt_token_ids":' + orjson.dumps(gen.messages[d.index].prompt_ids) + b"}"
            if p.continuous_usage:  # this choice's prompt and its tokens so far
                n, m = prompt_lens[d.index], generated[d.index]
                usage = {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}
                return sse(dict(head, choices=[orjson.Fragment(choice)], usage=usage))
            return open_ + choice + close

        def usage_chunk(usage: dict) -> bytes:
            return sse(dict(head, choices=[], usage=usage))

        gw = self.gw
        return await stream_sse(self.http, gen, [sse(c) for c in prelude], chunk_of,
                                usage_chunk if p.include_usage else None, on_tokens=gw.metrics.tokens.inc,
                                buffer_limit=gw.config.stream_buffer_bytes, on_stall=gw.metrics.stalled.inc)

    async def _one_body(self, gen: Generation, response: EndpointResponse, prompt_ids) -> web.Response:
        p = self.params
        count = len(gen.choices)
        ids: list[list[int]] = [[] for _ in range(count)]
        finish: list[str | None] = [None] * count
        async for d in gen.deltas():
            ids[d.index].extend(d.token_ids)
            if d.finish_reason:
                finish[d.index] = d.finish_reason
            response.take(d)
        self.gw.metrics.tokens.inc(sum(len(i) for i in ids))
        choices = []
        for i in range(count):
            choice = response.body_choice(i, finish[i])
            if p.return_token_ids:
                choice["token_ids"] = ids[i]
                if response.prompt_ids_per_choice:
                    choice["prompt_token_ids"] = list(gen.messages[i].prompt_ids)
            choices.append(choice)
        body = response.body(choices, gen.usage)
        if p.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
        return json_response(body)
