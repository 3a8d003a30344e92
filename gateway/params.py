"""The fields /v1/chat/completions and /v1/completions share: sampling, stops, n, streaming, class.

``parse_common(fields, headers, kind)`` checks them and returns a ``CommonParams``;
``sampling_for(params, max_tokens, i)`` builds the ``SamplingParams`` of choice
``i`` (its seed is ``seed + i``). Ranges follow OpenAI's API (temperature in
[0, 2], presence/frequency penalties in [-2, 2], at most 64 stop strings (OpenAI's 4, raised as vLLM
takes any number), n up to
128, top_logprobs up to 20, logit_bias of token ids to [-100, 100]) plus vLLM's
extensions (top_k with -1 or 0 for off, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, allowed_token_ids, bad_words, include_stop_str_in_output,
skip_special_tokens, return_token_ids, return_tokens_as_token_ids, prompt_logprobs: 0 to 20
alternatives per scored prompt token; chat only: thinking_token_budget,
``gateway.thinking_budget``). Token ids are checked against
the served model's vocabulary, bad words tokenized by its tokenizer and the
thinking budget's ids found in it, once the model is known (``for_model``);
the chat path says whether its prompt opened a thinking block (``thinking_open``).
Request class: the body's ``request_class`` (or ``priority``) as "interactive"
or "agent" (vLLM's integer ``priority``: 0 or less interactive, more agent),
else the ``X-Ignis-Request-Class`` header, else interactive.
``prompt_cache_key`` (OpenAI's, at most 1,024 characters) puts the request in
a conversation family: the engine gets a digest of the caller's credentials
and the key (``cache_family``), never the key, and ranks the retained entries
of an active family above idle ones; reuse itself stays by content.
``cache_salt`` (vLLM's: a non-empty string, at most 4,096 characters) confines
the request's prompt reuse to requests with the same salt: the engine gets a
digest of the salt (``cache_salt``), never the salt, and folds it into the
prompt's reuse keys (``engine.reuse.salt_keys``).
A field the request leaves out among temperature, top_p, top_k, min_p and
repetition_penalty takes the served model's recommended value when it has one
(``gateway.sampling_defaults``, applied by ``for_model``), else OpenAI's default.
``response_format`` becomes the grammar of every choice
(``gateway/response_format.py``); it cannot be combined with ``ignore_eos``
(a complete output ends with the end-of-sequence token).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from ignis.gateway.bad_words import bad_word_ids, parse_bad_words
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.response_format import parse_response_format
from ignis.gateway.sampling_defaults import REQUEST_FIELDS, SamplingDefaults
from ignis.gateway.thinking_budget import FIELD as THINKING_BUDGET
from ignis.gateway.thinking_budget import ThinkingBudget, for_tokenizer, parse_thinking_budget
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.sampling import (
    LOGIT_BIAS_LIMIT,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    SamplingParams,
)
from ignis.shared.wire import REQUEST_CLASSES
from ignis.shared.wire_fields import MAX_TOKEN_ID

MAX_N = 128
"""Choices of one prompt: pass@k evaluations ask for dozens (vLLM sets no bound; each is an engine request)."""
MAX_STOPS = 64
"""OpenAI takes 4 stop strings, vLLM any number (lm-eval's ``until`` lists run longer than 4)."""
MAX_STOP_CHARS = 1000
MAX_SEED = 2**63 - 1
MAX_CACHE_KEY_CHARS = 1024
MAX_CACHE_SALT_CHARS = 4096
CLASS_HEADER = "X-Ignis-Request-Class"


@dataclass(frozen=True)
class CommonParams:
    model: str | None
    stream: bool
    include_usage: bool
    n: int
    stops: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int | None
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    request_class: str
    grammar: str | None = None
    cache_family: str | None = None
    cache_salt: str | None = None
    """A digest of vLLM's ``cache_salt``: reuse only among requests with the same salt."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    allowed_token_ids: tuple[int, ...] = ()
    """vLLM's: only these ids may be sampled (ascending, distinct; empty: all)."""
    bad_words: tuple[str, ...] = ()
    """vLLM's: words never generated (``gateway.bad_words``); the engine gets ``bad_word_ids``."""
    bad_word_ids: tuple[tuple[int, ...], ...] = ()
    """``bad_words`` as the served model's token sequences (``for_model``)."""
    include_stop_str_in_output: bool = False
    """vLLM's: the stop string that ends a choice stays at the end of its text."""
    skip_special_tokens: bool = True
    """vLLM's: false shows special tokens' text in the output (all but the stop token it ended on)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's: logprobs name tokens "token_id:<id>" instead of by their text."""
    truncate_prompt_tokens: int | None = None
    """vLLM's: keep only the prompt's last this many tokens (-1: the model's length; ``gateway.prompt_truncation``)."""
    continuous_usage: bool = False
    """vLLM's ``stream_options.continuous_usage_stats`` (with include_usage): usage in every chunk."""
    prompt_logprobs: int | None = None
    """vLLM's: score the prompt with this many alternatives per token (None: not asked)."""
    thinking_token_budget: int | None = None
    """vLLM's: at most this many tokens inside a thinking block (None: no cap); ``thinking`` once the model is known."""
    thinking: ThinkingBudget | None = None
    """The budget with the served model's ids (``for_model``)."""
    thinking_open: bool = False
    """The prompt left a thinking block open (set by the chat path once it is rendered)."""
    omitted: frozenset[str] = frozenset()
    """The sampling fields the request left out, which the model's defaults fill (``for_model``)."""

    def for_vocabulary(self, f: Fields, vocab_size: int) -> CommonParams:
        """These params for a model of ``vocab_size`` token ids: ``logit_bias`` and ``stop_token_ids`` ids
        it does not have are refused; a ``top_k`` of the vocabulary or more keeps every token (off)."""
        if self.logit_bias and self.logit_bias[-1][0] >= vocab_size:
            raise f.error("logit_bias", f"token id {self.logit_bias[-1][0]} is outside the vocabulary "
                                        f"(size {vocab_size})")
        bad = next((t for t in self.stop_token_ids if t >= vocab_size), None)
        if bad is not None:
            raise f.error("stop_token_ids", f"token id {bad} is outside the vocabulary (size {vocab_size})")
        if self.allowed_token_ids and self.allowed_token_ids[-1] >= vocab_size:
            raise f.error("allowed_token_ids", f"token id {self.allowed_token_ids[-1]} is outside the vocabulary "
                                               f"(size {vocab_size})")
        return dataclasses.replace(self, top_k=0) if self.top_k >= vocab_size else self

    def for_model(self, f: Fields, tokenizer: TextTokenizer,
                  defaults: SamplingDefaults = SamplingDefaults()) -> CommonParams:
        """``for_vocabulary`` of the served model's tokenizer, the fields the request left out taken from the
        model's ``defaults``, with ``bad_words`` as its token sequences and the thinking budget's ids."""
        p = self.with_defaults(defaults).for_vocabulary(f, tokenizer.vocab_size)
        if p.bad_words:
            p = dataclasses.replace(p, bad_word_ids=bad_word_ids(f, p.bad_words, tokenizer))
        if p.thinking_token_budget is not None:
            p = dataclasses.replace(p, thinking=for_tokenizer(f, p.thinking_token_budget, tokenizer))
        return p

    def first_come(self, f: Fields) -> CommonParams:
        """These params under ``--scheduling-policy fcfs``: interactive, and vLLM's refusal of a priority."""
        priority = f.raw("priority")
        if type(priority) is int and priority != 0:
            raise f.error("priority", "is not taken: priority scheduling is off (--scheduling-policy fcfs)")
        return dataclasses.replace(self, request_class="interactive")

    def with_defaults(self, defaults: SamplingDefaults) -> CommonParams:
        """These params with the model's defaults in the sampling fields the request left out."""
        fields = defaults.fields(self.omitted)
        return dataclasses.replace(self, **fields) if fields else self


def _allowed_ids(f: Fields) -> tuple[int, ...]:
    value = f.raw("allowed_token_ids")
    if value is None:
        return ()
    if type(value) is not list or not value or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise f.error("allowed_token_ids", "must be a non-empty array of token ids")
    if len(value) > MAX_ALLOWED_TOKEN_IDS:
        raise f.error("allowed_token_ids", f"has {len(value)} ids, at most {MAX_ALLOWED_TOKEN_IDS} allowed")
    return tuple(sorted(set(value)))


def _skip_special_tokens(f: Fields) -> bool:
    """vLLM's ``skip_special_tokens``; its ``spaces_between_special_tokens`` is taken and checked, and changes
    nothing: a fast tokenizer's decoding puts no spaces between special tokens (vLLM's with one neither)."""
    f.bool("spaces_between_special_tokens", True)
    return f.bool("skip_special_tokens", True)


def _truncation(f: Fields) -> int | None:
    value = f.int("truncate_prompt_tokens", None, -1)
    if value == 0:
        raise f.error("truncate_prompt_tokens", "must be -1 (the model's length) or at least 1, got 0")
    return value


def _stops(f: Fields) -> tuple[str, ...]:
    value = f.raw("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise f.error("stop", "must be a string or an array of strings")
    if len(items) > MAX_STOPS:
        raise f.error("stop", f"has {len(items)} strings, at most {MAX_STOPS} allowed")
    for s in items:
        if not isinstance(s, str) or not s:
            raise f.error("stop", "every stop string must be a non-empty string")
        if len(s) > MAX_STOP_CHARS:
            raise f.error("stop", f"a stop string is {len(s)} characters, at most {MAX_STOP_CHARS} allowed")
    return tuple(items)


def _cache_family(f: Fields, headers) -> str | None:
    """The digest of the caller's credentials and ``prompt_cache_key``, or None without a key."""
    key = f.str("prompt_cache_key", None, max_chars=MAX_CACHE_KEY_CHARS)
    if not key:
        return None
    caller = headers.get("Authorization", "") if headers is not None else ""
    return hashlib.sha256(f"{caller}\n{key}".encode("utf-8", "surrogatepass")).hexdigest()[:32]  # header bytes as sent


def _cache_salt(f: Fields) -> str | None:
    """The digest of vLLM's ``cache_salt``, or None without one (an empty salt is a 400, as in vLLM)."""
    salt = f.str("cache_salt", None, max_chars=MAX_CACHE_SALT_CHARS)
    if salt is None:
        return None
    if not salt:
        raise f.error("cache_salt", "must be a non-empty string")
    return hashlib.sha256(f"ignis-cache-salt\n{salt}".encode()).hexdigest()


def _request_class(f: Fields, headers) -> str:
    for name in ("request_class", "priority"):
        if f.has(name):
            f.passed_over("request_class", "priority")  # the first given wins
            value = f.raw(name)
            if name == "priority" and type(value) is int:  # vLLM's integer priority: lower is served first
                return "interactive" if value <= 0 else "agent"
            if value not in REQUEST_CLASSES:
                raise f.error(name, f"must be one of {', '.join(map(repr, REQUEST_CLASSES))}, got {value!r}")
            return value
    header = headers.get(CLASS_HEADER) if headers is not None else None
    if header is None:
        return "interactive"
    value = header.strip().lower()
    if value not in REQUEST_CLASSES:
        raise invalid(f"header {CLASS_HEADER} must be one of {', '.join(REQUEST_CLASSES)}, got {header!r}",
                      CLASS_HEADER)
    return value


def _logprobs(f: Fields, kind: str) -> tuple[bool, int]:
    if kind == "completion":
        # Legacy completions: logprobs is the number of alternatives (0 = the chosen token's only).
        top = f.int("logprobs", None, 0, MAX_TOP_LOGPROBS)
        return top is not None, top or 0
    want = f.bool("logprobs")
    top = f.int("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not want:
        raise f.error("top_logprobs", "needs logprobs=true")
    return want, top


def _seed(f: Fields) -> int | None:
    """vLLM's 64-bit ``seed``: -1 is no seed (vLLM's: a UI's "random"), another negative one is taken modulo
    2^63 (the engine's generators take 0 .. 2^63-1)."""
    seed = f.int("seed", None, -MAX_SEED - 1, MAX_SEED)
    return None if seed is None or seed == -1 else seed % (MAX_SEED + 1)


def _logit_bias(f: Fields) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` object as ascending ``(id, bias)`` pairs."""
    value = f.raw("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise f.error("logit_bias", "must be an object mapping token ids to biases")
    if len(value) > MAX_LOGIT_BIAS:
        raise f.error("logit_bias", f"has {len(value)} entries, at most {MAX_LOGIT_BIAS} allowed")
    pairs = {}
    for key, bias in value.items():
        key_text = key.strip()
        if not key_text.isascii() or not key_text.isdigit() or len(key_text) > 10:
            raise f.error("logit_bias", f"keys must be token ids, got {key[:40]!r}")
        if type(bias) not in (int, float) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise f.error("logit_bias", f"the bias of {key_text} must be a number in [-100, 100], got {bias!r}")
        token = int(key_text)
        if token in pairs:
            raise f.error("logit_bias", f"token id {token} is given twice")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _unsupported(f: Fields) -> None:
    best_of = f.int("best_of", None, 1)
    if best_of is not None and best_of != f.int("n", 1):
        raise f.error("best_of", "is not supported (other than equal to n)")


def parse_common(f: Fields, headers, kind: str) -> CommonParams:
    """``kind`` is "chat" or "completion" (they differ in max_tokens names and logprobs)."""
    _unsupported(f)
    stream = f.bool("stream")
    opts = f.object("stream_options")
    if opts is not None and not stream:
        raise f.error("stream_options", "is only allowed with stream=true")
    include_usage = opts.bool("include_usage") if opts is not None else False
    # vLLM's: with include_usage, every chunk carries its choice's usage so far
    continuous_usage = include_usage and opts.bool("continuous_usage_stats")
    if kind == "chat" and f.has("max_completion_tokens"):
        max_tokens = f.int("max_completion_tokens", None, 1)
        f.passed_over("max_tokens")  # OpenAI's newer name wins
    elif kind == "completion" and f.raw("max_tokens") == 0 and type(f.raw("max_tokens")) is int and f.bool("echo"):
        max_tokens = 0  # the prompt echoed and scored, nothing generated (OpenAI's legacy scoring call)
    else:
        max_tokens = f.int("max_tokens", None, 1)
    top_k = min(f.int("top_k", 0, -1), MAX_TOKEN_ID)  # past the vocabulary: off (``for_vocabulary``)
    stop_ids = f.list("stop_token_ids", max_items=MAX_STOP_TOKEN_IDS) or []
    if any(type(t) is not int or t < 0 for t in stop_ids):
        raise f.error("stop_token_ids", "must be an array of token ids")
    logprobs, top_logprobs = _logprobs(f, kind)
    grammar = parse_response_format(f)
    if grammar is not None and f.bool("ignore_eos"):
        raise f.error("ignore_eos", "cannot be combined with a JSON response_format")
    min_tokens = f.int("min_tokens", 0, 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise f.error("min_tokens", f"must be at most max_tokens ({max_tokens}), got {min_tokens}")
    if grammar is not None and min_tokens:
        raise f.error("min_tokens", "cannot be combined with a JSON response_format (the grammar decides the end)")
    if kind != "chat" and f.raw(THINKING_BUDGET) is not None:
        raise f.error(THINKING_BUDGET, "is taken by /v1/chat/completions (a chat prompt says where a thinking "
                                       "block opens)")
    return CommonParams(
        model=f.str("model", None, max_chars=256),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        truncate_prompt_tokens=_truncation(f),
        allowed_token_ids=_allowed_ids(f),
        bad_words=parse_bad_words(f),
        include_stop_str_in_output=f.bool("include_stop_str_in_output"),
        skip_special_tokens=_skip_special_tokens(f),
        return_tokens_as_token_ids=f.bool("return_tokens_as_token_ids"),
        n=f.int("n", 1, 1, MAX_N),
        stops=_stops(f),
        stop_token_ids=tuple(stop_ids),
        max_tokens=max_tokens,
        temperature=f.number("temperature", 1.0, 0.0, 2.0),
        top_p=f.number("top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=max(top_k, 0),
        min_p=f.number("min_p", 0.0, 0.0, 1.0),
        presence_penalty=f.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=f.number("repetition_penalty", 1.0, 0.0, 100.0, lo_open=True),
        seed=_seed(f),
        ignore_eos=f.bool("ignore_eos"),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        return_token_ids=f.bool("return_token_ids"),
        request_class=_request_class(f, headers),
        grammar=grammar,
        cache_family=_cache_family(f, headers),
        cache_salt=_cache_salt(f),
        logit_bias=_logit_bias(f),
        min_tokens=min_tokens,
        prompt_logprobs=f.int("prompt_logprobs", None, 0, MAX_TOP_LOGPROBS),
        thinking_token_budget=parse_thinking_budget(f) if kind == "chat" else None,
        omitted=frozenset(name for name in REQUEST_FIELDS if not f.has(name)),
    )


def sampling_for(p: CommonParams, max_tokens: int, index: int) -> SamplingParams:
    """Choice ``index``'s sampling parameters."""
    seed = None if p.seed is None else (p.seed + index) % (MAX_SEED + 1)
    try:
        return _sampling(p, max_tokens, seed)
    except (TypeError, ValueError) as e:  # every field was checked above: this is a gap in those checks
        raise invalid(f"sampling parameters: {e}", None) from None


def _sampling(p: CommonParams, max_tokens: int, seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty, seed=seed, max_tokens=max_tokens,
        stop_token_ids=p.stop_token_ids, ignore_eos=p.ignore_eos, logprobs=p.logprobs,
        top_logprobs=p.top_logprobs, logit_bias=p.logit_bias, min_tokens=min(p.min_tokens, max_tokens),
        prompt_logprobs=p.prompt_logprobs, allowed_token_ids=p.allowed_token_ids, bad_words=p.bad_word_ids,
        **(p.thinking.sampling_fields(p.thinking_open) if p.thinking is not None else {}),
    )
