"""The gateway <-> engine wire protocol: typed messages and their ZeroMQ framing.

A protocol of its own (``GATEWAY_ENGINE``: version, message types) on the one
codec (``shared.wire_codec``). A message is a ZeroMQ multipart message:

    frame 0    orjson header {"type": <name>, "v": PROTOCOL_VERSION, <fields>...}
    frame 1    Generate: prompt_ids; TokenBatch: every stream's tokens
               (raw little-endian int32, see ``shared.wire_fields``)
    frame 2..  Generate with images: one raw RGB frame per image (``shared.wire_images``)

No pickle anywhere. ``encode(msg) -> list[bytes]`` and
``decode(frames) -> msg``; decode raises ``WireError`` (never anything else)
for anything malformed: not a list of byte frames, bad JSON, unknown type,
wrong version, wrong field types, ragged frames, out-of-range values, missing
or unknown fields. Every message checks its own fields when built, so a
malformed message cannot be sent either.

Directions (``GATEWAY_TO_ENGINE``, ``ENGINE_TO_GATEWAY``):
    gateway -> engine   Generate, Abort, Stats, FlushCache, LoadAdapter, UnloadAdapter, Profile, ListAdapters
    engine -> gateway   Admitted, TokenBatch, PromptLogprobs, Finished, Refused, ErrorReply, StatsReply,
                        CacheFlushed, AdapterUpdated, Profiled, AdapterList

``n`` (several choices) is not a field: the gateway fans a request out into
one Generate per choice. The gateway reads a TokenBatch as its columns
(``decode(frames, readers=TOKEN_COLUMNS)`` gives a ``TokenColumns``, checked
the same way), with no ``StreamTokens`` per stream; ``plain_token_columns`` reads
the common one (no logprobs) in a few microseconds, and hands anything else to
that decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import orjson

from ignis.shared.sampling import SamplingParams
from ignis.shared.wire_codec import MAX_HEADER_BYTES, ErrorReply, WireProtocol
from ignis.shared.wire_fields import (
    MAX_FRAME_TOKENS,
    MAX_GRAMMAR_CHARS,
    MAX_INT,
    MAX_TEXT_CHARS,
    TokenFrame,
    WireError,
    check_choice,
    check_float,
    check_int,
    check_opt_int,
    check_str,
    check_token_ids,
    frame_to_tokens,
    tokens_to_frame,
)
from ignis.shared.wire_images import ImageFrames, check_images
from ignis.shared.wire_parts import MAX_STREAM_ID_CHARS, ReuseInfo, StreamTokens, Timings, TokenLogprobs, Usage
from ignis.shared.wire_values import check_field_names

__all__ = [
    "PROTOCOL_VERSION", "WireError", "SamplingParams", "TokenLogprobs", "StreamTokens", "Usage",
    "Timings", "ReuseInfo", "Generate", "Abort", "Stats", "TokenBatch", "PromptLogprobs", "Admitted", "Finished",
    "Refused",
    "ErrorReply", "StatsReply", "FlushCache", "CacheFlushed", "LoadAdapter",
    "UnloadAdapter", "AdapterUpdated", "ListAdapters", "AdapterList", "Profile", "Profiled", "TokenColumns", "TOKEN_COLUMNS", "plain_token_columns", "GATEWAY_TO_ENGINE",
    "ENGINE_TO_GATEWAY", "GATEWAY_ENGINE", "encode", "decode",
]

GATEWAY_ENGINE = WireProtocol("gateway-engine", version=1)
PROTOCOL_VERSION = GATEWAY_ENGINE.version
"""The header's ``v``, checked first on every message. It stays 1 like the tier protocol's: shared types
(ErrorReply, Stats) cross both protocols and a frame of the other one must fail on its type, so a bump here
makes every tierd frame fail on its version instead. A gateway-engine contract version would travel in a
hello, as ``TIER_PROTOCOL_VERSION`` does; until then peers of different commits refuse each other's
changed messages as malformed."""

MAX_ID_CHARS = 256
MAX_NOTE_CHARS = 1024
MAX_PATH_CHARS = 4096
MAX_PROFILE_ROUNDS = 1_000_000
MAX_ADAPTERS = 1024
MAX_STATS = 1024
MAX_PROMPT_SCORES = 4096
"""Prompt tokens one PromptLogprobs message scores (a longer prompt's scores take several)."""

REQUEST_CLASSES = ("interactive", "agent")
FINISH_REASONS = ("stop", "length", "abort", "error")
REFUSAL_REASONS = ("queue_full", "too_long", "bad_request", "unknown_model", "shutting_down")


def _check_id(value: object, name: str = "id") -> str:
    return check_str(name, value, MAX_ID_CHARS, allow_empty=False)


# ----- gateway -> engine ---------------------------------------------------


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Generate:
    """Start one completion stream.

    Capture marks are token indices into ``prompt_ids`` computed by the gateway
    from the rendered template: ``system_end`` is where the system + tools block
    ends, ``opener_start`` where the generation opener (``<|im_start|>assistant``)
    starts; ``last_is_user`` says the last message is a real user turn (not a
    tool result). ``mark_missing`` names the marks the gateway could not find
    and why (``"system_end: not_a_prefix"``), for the done line. ``model``
    names the model asked for (None: the loaded one). ``part_end`` is where
    the final text part of the newest multi-part user message starts
    (``gateway.part_marks``). ``grammar`` (llguidance's grammar text, JSON or
    Lark) constrains every output token; None leaves the output free.
    ``cache_family`` names the conversation family the client's
    ``prompt_cache_key`` puts the request in (a digest, never the key): a
    ranking hint for retained entries, never part of a lookup. ``cache_salt``
    is a digest of the client's ``cache_salt`` (never the salt): the request
    reuses only retained state made under the same one. ``adapter`` names the
    LoRA adapter (of the model) the request runs with. ``images``
    are the prompt's pictures, resized by the gateway, in prompt order: one
    per run of image placeholder tokens (raw frames, never pickled; left out
    of the header when there are none). ``notes`` names what the gateway could
    not honour for this request (a schema held leniently, a hosted tool left
    out, a format not enforced), for the done line. The last eight are optional
    on the wire.
    """

    TYPE: ClassVar[str] = "generate"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("mark_missing", "part_end", "grammar", "cache_family", "cache_salt",
                                          "adapter", "notes")

    id: str
    prompt_ids: TokenFrame
    sampling: SamplingParams
    system_end: int | None = None
    opener_start: int | None = None
    last_is_user: bool = False
    request_class: str = "interactive"
    model: str | None = None
    mark_missing: str | None = None
    part_end: int | None = None
    grammar: str | None = None
    cache_family: str | None = None
    cache_salt: str | None = None
    adapter: str | None = None
    images: ImageFrames = ()
    notes: str | None = None

    def __post_init__(self):
        _check_id(self.id)
        ids = check_token_ids("prompt_ids", self.prompt_ids)
        if not ids:
            raise ValueError("prompt_ids must not be empty")
        object.__setattr__(self, "prompt_ids", ids)
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        n = len(ids)
        check_opt_int("system_end", self.system_end, 0, n)
        check_opt_int("opener_start", self.opener_start, 0, n)
        if self.system_end is not None and self.opener_start is not None and self.system_end > self.opener_start:
            raise ValueError(f"system_end ({self.system_end}) is after opener_start ({self.opener_start})")
        check_opt_int("part_end", self.part_end, 0, n if self.opener_start is None else self.opener_start)
        if type(self.last_is_user) is not bool:
            raise TypeError("last_is_user must be true or false")
        check_choice("request_class", self.request_class, REQUEST_CLASSES)
        if self.model is not None:
            check_str("model", self.model, MAX_ID_CHARS, allow_empty=False)
        if self.mark_missing is not None:
            check_str("mark_missing", self.mark_missing, MAX_ID_CHARS, allow_empty=False)
        if self.grammar is not None:
            check_str("grammar", self.grammar, MAX_GRAMMAR_CHARS, allow_empty=False)
        if self.cache_family is not None:
            check_str("cache_family", self.cache_family, MAX_ID_CHARS, allow_empty=False)
        if self.cache_salt is not None:
            check_str("cache_salt", self.cache_salt, MAX_ID_CHARS, allow_empty=False)
        if self.adapter is not None:
            check_str("adapter", self.adapter, MAX_ID_CHARS, allow_empty=False)
        if self.notes is not None:
            check_str("notes", self.notes, MAX_NOTE_CHARS, allow_empty=False)
        object.__setattr__(self, "images", check_images("images", self.images))


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Abort:
    """Stop a stream (client went away, or the gateway gave up on it). ``reason`` "stop": the output is
    complete before the engine ended it (a stop string matched, or a tool call past ``max_calls`` began),
    so the request ends as a stop, not an abort; ``kept_tokens`` (optional) then says how many of the
    tokens sent the output kept: its usage and done line count those, not what was sampled past them."""

    TYPE: ClassVar[str] = "abort"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("reason", "kept_tokens")
    REASONS: ClassVar[tuple[str, ...]] = ("abort", "stop")

    id: str
    reason: str = "abort"
    kept_tokens: int | None = None

    def __post_init__(self):
        _check_id(self.id)
        check_choice("reason", self.reason, self.REASONS)
        check_opt_int("kept_tokens", self.kept_tokens)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Stats:
    """Ask the engine for a StatsReply."""

    TYPE: ClassVar[str] = "stats"


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class FlushCache:
    """Drop every retained entry in every tier (vLLM's /reset_prefix_cache, SGLang's /flush_cache), once
    the engine holds no request; answered by ``CacheFlushed`` with the same ``id``."""

    TYPE: ClassVar[str] = "flush_cache"

    id: str

    def __post_init__(self):
        _check_id(self.id)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class LoadAdapter:
    """Serve the LoRA adapter at ``path`` as ``name`` with the default model (``engine.lora_updates``);
    answered by ``AdapterUpdated`` with the same ``id``. ``inplace`` (vLLM's ``load_inplace``) True: an
    adapter already served as ``name`` has its weights replaced by those at ``path`` (none: a plain load);
    None or False: a plain load, refused when the name is taken. The gateway sends True or leaves it out,
    so an engine that predates the field still decodes every plain load."""

    TYPE: ClassVar[str] = "load_adapter"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("inplace",)

    id: str
    name: str
    path: str
    inplace: bool | None = None

    def __post_init__(self):
        _check_id(self.id)
        check_str("name", self.name, MAX_ID_CHARS, allow_empty=False)
        check_str("path", self.path, MAX_PATH_CHARS, allow_empty=False)
        if self.inplace is not None and type(self.inplace) is not bool:
            raise TypeError("inplace must be true or false")


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class UnloadAdapter:
    """Stop serving the LoRA adapter ``name``; answered by ``AdapterUpdated`` with the same ``id``."""

    TYPE: ClassVar[str] = "unload_adapter"

    id: str
    name: str

    def __post_init__(self):
        _check_id(self.id)
        check_str("name", self.name, MAX_ID_CHARS, allow_empty=False)


# ----- engine -> gateway ---------------------------------------------------


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class TokenBatch:
    """Every stream's new tokens from one engine round, in one message.

    Layout: header ``ids`` and ``counts`` are parallel lists; frame 1 is all the
    streams' tokens concatenated in that order (stream i owns the slice after
    the first sum(counts[:i]) tokens). ``logprobs`` is present in the header
    only when some stream asked for it: a list parallel to ``ids`` of null or
    {"logprobs", "top_ids", "top_logprobs"} (-inf as null).
    """

    TYPE: ClassVar[str] = "token_batch"
    FRAMES: ClassVar[int] = 1  # all the streams' tokens, concatenated

    streams: tuple[StreamTokens, ...]

    def __post_init__(self):
        streams = tuple(self.streams) if isinstance(self.streams, (list, tuple)) else self.streams
        if type(streams) is not tuple or not all(isinstance(s, StreamTokens) for s in streams):
            raise TypeError("streams must be a list of StreamTokens")
        if len({s.id for s in streams}) != len(streams):
            raise ValueError("a stream appears twice in one TokenBatch")
        if sum(len(s.token_ids) for s in streams) > MAX_FRAME_TOKENS:
            raise ValueError(f"a TokenBatch holds at most {MAX_FRAME_TOKENS} tokens")
        object.__setattr__(self, "streams", streams)

    def to_wire(self) -> tuple[dict, list[bytes]]:
        fields = {"ids": [s.id for s in self.streams], "counts": [len(s.token_ids) for s in self.streams]}
        if any(s.logprobs is not None for s in self.streams):
            fields["logprobs"] = [None if s.logprobs is None else s.logprobs.to_json() for s in self.streams]
        return fields, [tokens_to_frame([t for s in self.streams for t in s.token_ids])]

    @classmethod
    def from_wire(cls, fields: dict, frames: list) -> TokenBatch:
        return cls(streams=TokenColumns.from_wire(fields, frames).streams())


class TokenColumns:
    """A TokenBatch as its decoded columns, with no ``StreamTokens`` per stream: what the gateway routes.

    ``GATEWAY_ENGINE.decode(frames, readers=TOKEN_COLUMNS)`` returns one in
    place of a TokenBatch, checked exactly as ``TokenBatch.from_wire`` checks
    (it is built from one):

        ids[i]        stream i's id (a non-empty string, unique in the batch)
        counts[i]     how many tokens stream i got (at least one)
        tokens        every stream's tokens, concatenated in the order of ``ids``
        logprobs      None, or a list parallel to ``ids`` of None | TokenLogprobs
    """

    __slots__ = ("ids", "counts", "tokens", "logprobs")

    def __init__(self, ids: list[str], counts: list[int], tokens: tuple[int, ...],
                 logprobs: list[TokenLogprobs | None] | None):
        self.ids, self.counts, self.tokens, self.logprobs = ids, counts, tokens, logprobs

    @classmethod
    def from_wire(cls, fields: dict, frames: list) -> TokenColumns:
        check_field_names(fields, ("ids", "counts"), optional=("logprobs",))
        ids, counts, lps = fields["ids"], fields["counts"], fields.get("logprobs")
        if type(ids) is not list or type(counts) is not list or len(ids) != len(counts):
            raise WireError("token_batch ids and counts must be lists of the same length")
        if lps is not None and (type(lps) is not list or len(lps) != len(ids)):
            raise WireError("token_batch logprobs must be a list parallel to ids")
        if not all(type(sid) is str and 0 < len(sid) <= MAX_STREAM_ID_CHARS for sid in ids):
            for sid in ids:  # the first bad one, named
                check_str("stream id", sid, MAX_STREAM_ID_CHARS, allow_empty=False)
        if len(set(ids)) != len(ids):
            raise WireError("a stream appears twice in one TokenBatch")
        if not all(type(c) is int and 1 <= c <= MAX_FRAME_TOKENS for c in counts):
            for i, c in enumerate(counts):
                check_int(f"counts[{i}]", c, 1, MAX_FRAME_TOKENS)
        tokens = frame_to_tokens("tokens", frames[0])
        total = sum(counts)
        if total != len(tokens):
            raise WireError(f"token_batch counts sum to {total} but the frame holds {len(tokens)} tokens")
        if lps is not None:
            lps = [None if lp is None else TokenLogprobs.from_json(lp) for lp in lps]
            for sid, c, lp in zip(ids, counts, lps):
                if lp is not None and lp.num_tokens != c:
                    raise ValueError(f"stream {sid!r} has {c} tokens but {lp.num_tokens} logprobs")
        return cls(ids, counts, tokens, lps)

    def streams(self) -> tuple[StreamTokens, ...]:
        """The batch's streams as ``StreamTokens`` (what ``TokenBatch`` holds)."""
        out, at, lps = [], 0, self.logprobs
        for i, (sid, c) in enumerate(zip(self.ids, self.counts)):
            out.append(StreamTokens(id=sid, token_ids=self.tokens[at:at + c], logprobs=None if lps is None else lps[i]))
            at += c
        return tuple(out)


TOKEN_COLUMNS = {TokenBatch: TokenColumns.from_wire}
"""``decode(..., readers=TOKEN_COLUMNS)``: a TokenBatch comes back as its ``TokenColumns``."""

_PLAIN_BATCH_KEYS = frozenset(("type", "v", "ids", "counts"))


def plain_token_columns(frames: object) -> TokenColumns | None:
    """The columns of a TokenBatch without logprobs (the gateway's steady state), read with only the checks
    that message needs: no generic field walk. None for anything else, well-formed or not (another type,
    logprobs, any flaw): ``decode(frames, readers=TOKEN_COLUMNS)`` then reads it, or names what is wrong.
    What it returns, that decode returns too."""
    if type(frames) is not list or len(frames) != 2:
        return None
    head, frame = frames
    if type(head) is not bytes or type(frame) is not bytes or len(head) > MAX_HEADER_BYTES:
        return None
    try:
        header = orjson.loads(head)
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict or header.keys() != _PLAIN_BATCH_KEYS or header["type"] != TokenBatch.TYPE:
        return None
    version, ids, counts = header["v"], header["ids"], header["counts"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        return None
    if type(ids) is not list or type(counts) is not list or len(ids) != len(counts):
        return None
    if not all(type(sid) is str and 0 < len(sid) <= MAX_STREAM_ID_CHARS for sid in ids) or len(set(ids)) != len(ids):
        return None
    if not all(type(c) is int and 1 <= c <= MAX_FRAME_TOKENS for c in counts):
        return None
    try:
        tokens = frame_to_tokens("tokens", frame)
    except WireError:
        return None
    if sum(counts) != len(tokens):
        return None
    return TokenColumns(ids, counts, tokens, None)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class PromptLogprobs:
    """Scores of a run of one stream's prompt tokens (``SamplingParams.prompt_logprobs``).

    Entry i is prompt token ``start + i`` (``start`` >= 1: the first token has
    no score): its log probability given the tokens before it in
    ``logprobs.logprobs[i]``, the most likely alternatives in
    ``logprobs.top_ids[i]`` / ``logprobs.top_logprobs[i]``, and ``ranks[i]``,
    1 + how many tokens were more likely. A stream's messages come in prompt
    order, each starting where the last ended, all before its first tokens.
    """

    TYPE: ClassVar[str] = "prompt_logprobs"
    FRAMES: ClassVar[int] = 0

    id: str
    start: int
    ranks: tuple[int, ...]
    logprobs: TokenLogprobs

    def __post_init__(self):
        _check_id(self.id)
        check_int("start", self.start, 1, 2**31 - 1)
        if not isinstance(self.logprobs, TokenLogprobs):
            raise TypeError("logprobs must be TokenLogprobs")
        ranks = tuple(self.ranks) if isinstance(self.ranks, (list, tuple)) else None
        if ranks is None or not all(type(r) is int and 1 <= r <= 2**31 - 1 for r in ranks):
            raise ValueError("ranks must be a list of integers >= 1")
        if not ranks or len(ranks) != self.logprobs.num_tokens or len(ranks) > MAX_PROMPT_SCORES:
            raise ValueError(f"ranks and logprobs must have one entry per token (1 to {MAX_PROMPT_SCORES})")
        object.__setattr__(self, "ranks", ranks)

    def to_wire(self) -> tuple[dict, list[bytes]]:
        return {"id": self.id, "start": self.start, "ranks": list(self.ranks),
                "logprobs": self.logprobs.to_json()}, []

    @classmethod
    def from_wire(cls, fields: dict, frames: list) -> PromptLogprobs:
        check_field_names(fields, ("id", "start", "ranks", "logprobs"))
        if type(fields["ranks"]) is not list:
            raise WireError("prompt_logprobs ranks must be a list")
        return cls(id=fields["id"], start=fields["start"], ranks=tuple(fields["ranks"]),
                   logprobs=TokenLogprobs.from_json(fields["logprobs"]))


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Admitted:
    """A stream took a lane for the first time: ``cached_tokens`` of its prompt were resumed from retained
    state (what its Finished will report), known before its first token. Sent once, before its first
    tokens; a stream refused, or ended before it was admitted, gets none."""

    TYPE: ClassVar[str] = "admitted"

    id: str
    cached_tokens: int

    def __post_init__(self):
        _check_id(self.id)
        check_int("cached_tokens", self.cached_tokens, 0, MAX_INT)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Finished:
    """The last message of a stream: why it ended, what it cost, what it reused. ``error_code`` (optional
    on the wire), with finish_reason "error": "" when the engine failed, "invalid_request" when the
    request itself cannot go on (its constraints leave no token): the client's error, not to be retried."""

    TYPE: ClassVar[str] = "finished"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("error_code",)
    ERROR_CODES: ClassVar[tuple[str, ...]] = ("", "invalid_request")

    id: str
    finish_reason: str
    usage: Usage
    reuse: ReuseInfo = ReuseInfo()
    timings: Timings = Timings()
    message: str = ""  # human-readable detail, set when finish_reason is "error"
    error_code: str = ""

    def __post_init__(self):
        _check_id(self.id)
        check_choice("finish_reason", self.finish_reason, FINISH_REASONS)
        check_choice("error_code", self.error_code, self.ERROR_CODES)
        for name, kind in (("usage", Usage), ("reuse", ReuseInfo), ("timings", Timings)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name} must be {kind.__name__}")
        check_str("message", self.message, MAX_TEXT_CHARS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Refused:
    """A Generate the engine will not run; nothing was started for it."""

    TYPE: ClassVar[str] = "refused"

    id: str
    reason: str  # one of REFUSAL_REASONS
    message: str

    def __post_init__(self):
        _check_id(self.id)
        check_choice("reason", self.reason, REFUSAL_REASONS)
        check_str("message", self.message, MAX_TEXT_CHARS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class StatsReply:
    """Named engine counters and gauges (finite numbers only); ``models`` (optional): the names the engine
    serves, in its order (``max_model_len_<i>`` names the i-th), so a gateway can see it asks for others
    (empty: not said; an engine serving more than ``MAX_MODELS`` says none)."""

    TYPE: ClassVar[str] = "stats_reply"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("models",)
    MAX_MODELS: ClassVar[int] = 64

    values: dict
    models: tuple[str, ...] = ()

    def __post_init__(self):
        if type(self.models) is list:
            object.__setattr__(self, "models", tuple(self.models))
        if type(self.models) is not tuple or len(self.models) > self.MAX_MODELS:
            raise TypeError(f"models must be a list of at most {self.MAX_MODELS} names")
        for name in self.models:
            check_str("model", name, MAX_ID_CHARS, allow_empty=False)
        if type(self.values) is not dict:
            raise TypeError("values must be a dict of name -> number")
        if len(self.values) > MAX_STATS:
            raise ValueError(f"at most {MAX_STATS} stats allowed")
        for k, v in self.values.items():
            check_str("stat name", k, MAX_ID_CHARS, allow_empty=False)
            if type(v) is float:
                check_float(f"stat {k}", v, -math.inf, math.inf)
                if math.isinf(v):
                    raise ValueError(f"stat {k} must be finite")
            elif type(v) is not int or abs(v) > 2**63 - 1:
                raise TypeError(f"stat {k} must be a finite number, got {v!r}")


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class CacheFlushed:
    """The answer to ``FlushCache`` ``id``: ``flushed`` with ``entries`` retained entries dropped (on the
    device and as far as the engine knew below it), or not, and why (``message``: requests in flight)."""

    TYPE: ClassVar[str] = "cache_flushed"

    id: str
    flushed: bool
    entries: int = 0
    message: str = ""

    def __post_init__(self):
        _check_id(self.id)
        if type(self.flushed) is not bool:
            raise TypeError("flushed must be true or false")
        check_int("entries", self.entries, 0, 2**63 - 1)
        check_str("message", self.message, MAX_TEXT_CHARS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class AdapterUpdated:
    """The answer to ``LoadAdapter``/``UnloadAdapter`` ``id``: done (``ok``) or not, and why; ``missing``:
    the adapter to unload is not served."""

    TYPE: ClassVar[str] = "adapter_updated"

    id: str
    ok: bool
    message: str = ""
    missing: bool = False

    def __post_init__(self):
        _check_id(self.id)
        for name in ("ok", "missing"):
            if type(getattr(self, name)) is not bool:
                raise TypeError(f"{name} must be true or false")
        check_str("message", self.message, MAX_TEXT_CHARS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Profile:
    """Start (``start``) or stop the engine's torch profiler (vLLM's /start_profile and /stop_profile,
    ``engine.profiling``); a start with ``rounds`` stops by itself after that many rounds. Answered by
    ``Profiled`` with the same ``id``."""

    TYPE: ClassVar[str] = "profile"

    id: str
    start: bool
    rounds: int = 0

    def __post_init__(self):
        _check_id(self.id)
        if type(self.start) is not bool:
            raise TypeError("start must be true or false")
        check_int("rounds", self.rounds, 0, MAX_PROFILE_ROUNDS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class Profiled:
    """The answer to ``Profile`` ``id``: done (``ok``) or not, and why (``message``); a stop names the
    files it wrote (``trace``: the Chrome trace, ``summary``: the top operators as text)."""

    TYPE: ClassVar[str] = "profiled"

    id: str
    ok: bool
    message: str = ""
    trace: str = ""
    summary: str = ""

    def __post_init__(self):
        _check_id(self.id)
        if type(self.ok) is not bool:
            raise TypeError("ok must be true or false")
        check_str("message", self.message, MAX_TEXT_CHARS)
        check_str("trace", self.trace, MAX_PATH_CHARS)
        check_str("summary", self.summary, MAX_PATH_CHARS)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class ListAdapters:
    """Which LoRA adapters the default model is served with now; answered by ``AdapterList``. A gateway asks
    when the Stats' ``lora_adapters_version`` moves (another gateway loaded or unloaded one, or the engine
    restarted)."""

    TYPE: ClassVar[str] = "list_adapters"

    id: str

    def __post_init__(self):
        _check_id(self.id)


@GATEWAY_ENGINE.message
@dataclass(frozen=True)
class AdapterList:
    """The answer to ``ListAdapters`` ``id``: the adapters' ``names`` and ``paths`` in load order, as of
    ``version`` (the Stats' ``lora_adapters_version``)."""

    TYPE: ClassVar[str] = "adapter_list"

    id: str
    version: int
    names: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    def __post_init__(self):
        _check_id(self.id)
        check_int("version", self.version, 0, 2**63 - 1)
        for field_name, limit in (("names", MAX_ID_CHARS), ("paths", MAX_PATH_CHARS)):
            values = getattr(self, field_name)
            if type(values) not in (list, tuple) or len(values) > MAX_ADAPTERS:
                raise TypeError(f"{field_name} must be a list of at most {MAX_ADAPTERS} strings")
            for v in values:
                check_str(field_name, v, limit, allow_empty=False)
            object.__setattr__(self, field_name, tuple(values))
        if len(self.names) != len(self.paths):
            raise ValueError("names and paths must pair up")


GATEWAY_TO_ENGINE = (Generate, Abort, Stats, FlushCache, LoadAdapter, UnloadAdapter, Profile, ListAdapters)
ENGINE_TO_GATEWAY = (TokenBatch, PromptLogprobs, Admitted, Finished, Refused, ErrorReply, StatsReply, CacheFlushed,
                     AdapterUpdated, Profiled, AdapterList)

encode = GATEWAY_ENGINE.encode
decode = GATEWAY_ENGINE.decode
