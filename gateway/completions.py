"""POST /v1/completions: raw prompts (text or token ids), no template, no parsing.

``prompt`` is a string, an array of token ids, or an array of those (up to
``MAX_PROMPTS``; prompt k's j-th choice has index ``k * n + j``, as OpenAI
numbers them). ``max_tokens`` defaults to 16, as in OpenAI's API, and is
checked against each prompt. ``echo`` puts each prompt's text in front of its
choices; with ``logprobs`` the engine scores the prompt too, and the choice's
logprobs start with the prompt's tokens (the first with a null logprob), as
OpenAI's legacy API gives them (what ``lm-eval``'s loglikelihood requests read).
vLLM's ``prompt_logprobs`` adds each choice's ``prompt_logprobs`` list.
Responses are ``text_completion`` objects, with the legacy logprobs format.
A raw prompt has one capture mark, its checkpoint before its last token
(``raw_prompt_marks``), so a retry, a second choice or a prompt that goes on
from it resumes there (one token left to compute). A scored prompt (an
evaluation's loglikelihood request) has none: it is computed whole and
rarely sent again, so its image would only take a slot.
Generating and answering is ``GenerationRequest.answer_prompts``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import orjson
from aiohttp import web

from ignis.gateway.choice import ChoiceDelta
from ignis.gateway.fields import Fields
from ignis.gateway.generation import Generation
from ignis.gateway.generation_request import EndpointResponse, GenerationRequest
from ignis.gateway.params import CommonParams
from ignis.gateway.prompt_images import refuse_stray_placeholders
from ignis.gateway.prompt_logprobs import echo_logprobs, prompt_logprobs_json
from ignis.gateway.prompt_truncation import kept_tokens, truncate
from ignis.gateway.request_ids import response_id
from ignis.gateway.responses import CompletionLogprobs, merge_completion_logprobs
from ignis.gateway.state import GatewayState
from ignis.gateway.tokenizer import TextTokenizer

ENDPOINT = "completions"
DEFAULT_MAX_TOKENS = 16
LONG_TEXT = 20_000
"""Prompts longer than this (characters, all prompts together) are tokenized on a worker thread."""
MAX_PROMPTS = 256
"""A batch of prompts as lm-eval's ``batch_size`` sends them (vLLM takes any number)."""
MAX_CHOICES = 256
"""Prompts times ``n`` in one request; each choice is an engine request, so past ``--max-queue`` waiting ones
a batch is refused (429)."""


def raw_prompt_marks(ids: list[int]) -> dict:
    """A raw prompt hands over to the model at its last token: its checkpoint is there. It counts as
    made after a real user turn, so the conversation budget keeps it beside a longer prompt's."""
    return {"opener_start": len(ids) - 1, "last_is_user": True}


def _prompt_values(f: Fields) -> list[str | list[int]]:
    """The request's prompts as given: strings and lists of token ids."""
    value = f.raw("prompt")
    if value is None:
        raise f.error("prompt", "is required")
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(t) is int for t in value)):
        return [value]
    if not isinstance(value, list) or not value or not all(
            isinstance(v, str) or (isinstance(v, list) and all(type(t) is int for t in v)) for v in value):
        raise f.error("prompt", "must be a string, an array of token ids, or an array of those")
    if len(value) > MAX_PROMPTS:
        raise f.error("prompt", f"holds {len(value)} prompts, at most {MAX_PROMPTS} allowed")
    return value


def _token_ids(gw: GatewayState, f: Fields, values: list[str | list[int]]) -> list[list[int]]:
    out = []
    for k, value in enumerate(values):
        where = "prompt" if len(values) == 1 else f"prompt[{k}]"
        ids = gw.tokenizer.encode(value, add_special_tokens=True) if isinstance(value, str) else value
        bad = next((t for t in ids if not 0 <= t < gw.tokenizer.vocab_size), None)
        if bad is not None:
            raise f.error(where, f"token id {bad} is outside the vocabulary (size {gw.tokenizer.vocab_size})")
        if not ids:
            raise f.error(where, "is empty")
        refuse_stray_placeholders(ids, gw.vision, where)
        out.append(ids)
    return out


async def _prompts(gw: GatewayState, f: Fields) -> tuple[list[list[int]], list[str | None]]:
    """Each prompt's token ids, and its text when it came as text."""
    values = _prompt_values(f)
    if sum(len(v) for v in values if isinstance(v, str)) > LONG_TEXT:  # off the event loop: streams flow on
        ids = await asyncio.to_thread(_token_ids, gw, f, values)
    else:
        ids = _token_ids(gw, f, values)
    return ids, [v if isinstance(v, str) else None for v in values]


async def completions(request: web.Request) -> web.StreamResponse:
    """Create a completion of a raw prompt."""
    req = await GenerationRequest.read(request, "completion")
    gw, f, p = req.gw, req.fields, req.params
    if f.has("suffix"):
        raise f.error("suffix", "is not supported")
    echo = f.bool("echo")
    if p.max_tokens == 0:  # echo only (params): the engine makes one token, which no choice shows
        req.scoring_only = True
        req.params = p = dataclasses.replace(p, max_tokens=1)
    if echo and p.logprobs:  # the engine scores the prompt for the echoed tokens' logprobs
        req.params = dataclasses.replace(p, prompt_logprobs=max(p.top_logprobs, p.prompt_logprobs or 0))
    prompts, texts = await _prompts(gw, f)
    if p.truncate_prompt_tokens is not None:
        keep = kept_tokens(p.truncate_prompt_tokens, await gw.max_model_len(), p.max_tokens)
        cut = [truncate(ids, keep)[0] for ids in prompts]
        # echo shows what is sent: a cut prompt's kept tokens, not its text
        texts = [text if len(c) == len(ids) else None for c, ids, text in zip(cut, prompts, texts)]
        prompts = cut
    if len(prompts) * p.n > MAX_CHOICES:
        raise f.error("n", f"{len(prompts)} prompts times n = {p.n} is more than {MAX_CHOICES} choices")
    default = min(DEFAULT_MAX_TOKENS, gw.sampling_defaults.max_new_tokens or DEFAULT_MAX_TOKENS)
    limits = [await gw.max_tokens(len(ids), p.max_tokens, default, field="prompt") for ids in prompts]
    echo_texts = [""] * len(prompts)
    if echo:
        echo_texts = [text if text is not None else gw.tokenizer.decode(ids, skip_special_tokens=False)
                      for ids, text in zip(prompts, texts)]
    rid = response_id("cmpl", req.client_id)
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": gw.model_name}
    response = CompletionResponse(p, gw.tokenizer, head, [t for t in echo_texts for _ in range(p.n)])
    marks = None if req.params.prompt_logprobs is not None else raw_prompt_marks
    return await req.answer_prompts(ENDPOINT, rid, list(zip(prompts, limits)), response, marks=marks)


class CompletionResponse(EndpointResponse):
    """``text_completion`` objects, streamed or whole, with legacy logprobs; ``echo_texts[i]`` opens choice i
    (one per choice, empty: no echo). ``params`` are the request's own: their ``prompt_logprobs`` is what
    vLLM's field asked for (the engine may score an echoed prompt without it)."""

    prompt_ids_per_choice = True

    def __init__(self, params: CommonParams, tokenizer: TextTokenizer, head: dict, echo_texts: list[str]):
        super().__init__(params, tokenizer, head, head)
        self.echo_texts = echo_texts
        # One per choice: text offsets run on across every delta of the choice.
        self.lps = [CompletionLogprobs(as_ids=params.return_tokens_as_token_ids) for _ in echo_texts]
        self.acc = [{"text": text, "lps": [], "stop_reason": None} for text in echo_texts]
        self.echo_lps: list[dict | None] = [None] * len(echo_texts)  # an echoed prompt's legacy logprobs

    def opened(self, gen: Generation) -> None:
        super().opened(gen)
        if self.params.logprobs and any(self.echo_texts):
            for i, (ids, scores) in enumerate(self.prompts):
                self.echo_lps[i] = echo_logprobs(ids, scores, self.tokenizer, self.lps[i])
                if self.echo_lps[i] is not None:
                    self.acc[i]["lps"].append(self.echo_lps[i])

    def _with_prompt_logprobs(self, choice: dict, i: int) -> dict:
        if self.params.prompt_logprobs is not None:
            ids, scores = self.prompts[i]
            choice["prompt_logprobs"] = prompt_logprobs_json(ids, scores, self.tokenizer, self.params.prompt_logprobs)
        return choice

    def first_choices(self) -> list[dict]:
        if not any(self.echo_texts) and self.params.prompt_logprobs is None:
            return []
        return [self._with_prompt_logprobs({"index": i, "text": text, "logprobs": self.echo_lps[i],
                                            "finish_reason": None}, i)
                for i, text in enumerate(self.echo_texts)]

    def chunk_choice(self, d: ChoiceDelta) -> dict:
        choice = {"index": d.index, "text": d.content, "logprobs": None, "finish_reason": d.finish_reason}
        if d.finish_reason is not None:
            choice["stop_reason"] = d.stop_reason
        if self.params.logprobs and d.logprobs:
            choice["logprobs"] = self.lps[d.index].add(self.tokenizer, d.logprobs)
        return choice

    def chunk_choice_bytes(self, d: ChoiceDelta) -> bytes:
        if d.finish_reason is None and not (self.params.logprobs and d.logprobs):
            # the bytes chunk_choice's dict serialises to
            return b'{"index":%d,"text":%b,"logprobs":null,"finish_reason":null}' % (d.index, orjson.dumps(d.content))
        return orjson.dumps(self.chunk_choice(d))

    def take(self, d: ChoiceDelta) -> None:
        a = self.acc[d.index]
        a["text"] += d.content
        if self.params.logprobs and d.logprobs:
            a["lps"].append(self.lps[d.index].add(self.tokenizer, d.logprobs))
        if d.finish_reason is not None:
            a["stop_reason"] = d.stop_reason

    def body_choice(self, index: int, finish_reason: str | None) -> dict:
        a = self.acc[index]
        logprobs = merge_completion_logprobs(a["lps"]) if self.params.logprobs else None
        return self._with_prompt_logprobs(
            {"index": index, "text": a["text"], "logprobs": logprobs, "finish_reason": finish_reason,
             "stop_reason": a["stop_reason"]}, index)
