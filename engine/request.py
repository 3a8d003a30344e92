"""One request's bookkeeping inside the engine: what it asked for and how far it got.

Pure Python, no torch. The caller fills in what was asked (id, prompt, sampling,
class, capture marks, cut points); the scheduler owns everything else.

Token layout: a request's tokens are its prompt followed by its output,

    tokens      = prompt_ids + output_ids           (num_tokens of them)
    computed    = tokens[:num_computed_tokens]      KV and recurrent state exist
    next input  = tokens[num_computed_tokens]       (a decode feeds the last output)

so after a preemption (recompute) the request prefills ``tokens`` again from
position 0, its output so far included, and the last chunk's sampled token is
its next output token.

State machine (owned by the scheduler):

    WAITING --admit--> PREFILLING --last chunk sampled--> DECODING --stop/length--> FINISHED
       ^                    |                                 |
       +----- preempt ------+---------------------------------+      abort: any state -> FINISHED
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ignis.engine.image_layout import ImageLayout
from ignis.engine.reuse.image_keys import ImageKey, key_tokens, walk_back, walk_back_all
from ignis.engine.reuse.salt_keys import salt_chunks, salted, salted_image_digest
from ignis.engine.sequence_pages import SequencePages
from ignis.shared.image_input import ImageInput
from ignis.shared.sampling import SamplingParams
from ignis.shared.wire import MAX_ID_CHARS, REQUEST_CLASSES, Generate
from ignis.shared.wire_fields import check_choice, check_str, check_token_ids

CLASS_RANK = {name: rank for rank, name in enumerate(REQUEST_CLASSES)}
"""Lower rank is admitted first and preempted last: interactive (0) above agent (1)."""


class RequestState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    EVICTING = "evicting"  # holds its lane and pages while they move down a tier, window by window
    FINISHED = "finished"


def capture_cuts(prompt_len: int, system_end: int | None, opener_start: int | None, page_tokens: int,
                 part_end: int | None = None) -> tuple[int, ...]:
    """Where prefill must cut so capture points exist: the end of the system block
    rounded down to whole pages (retained prefix), the start of the newest
    multi-part user message's final text part (part boundary) and the generation
    opener (prompt checkpoint). Points that leave nothing before or after are dropped.
    A learned point is added later, by the scheduler (``engine.reuse.learned_points``)."""
    cuts = set()
    if system_end is not None:
        cuts.add(system_end // page_tokens * page_tokens)
    for mark in (part_end, opener_start):
        if mark is not None:
            cuts.add(mark)
    return tuple(sorted(c for c in cuts if 0 < c < prompt_len))


@dataclass(eq=False)
class Request:
    """A request as the scheduler tracks it; identity is the object (and ``req_id`` is unique)."""

    req_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    request_class: str = "interactive"
    system_end: int | None = None
    opener_start: int | None = None
    last_is_user: bool = False
    part_end: int | None = None
    cache_family: str | None = None  # the client's prompt_cache_key family (a ranking hint, engine.reuse.store)
    cache_salt: str | None = None
    """A digest of the client's ``cache_salt``: the request reuses only state made under the same salt
    (``engine.reuse.salt_keys``)."""
    adapter: str | None = None
    """The identity of the LoRA adapter the request runs with (``LoraSet.identity``: name and digest of its
    files): its state is the adapter's, so it reuses only state made under the same adapter (and salt)."""
    adapter_slot: int = -1  # the adapter's slot in the model's LoraSet (-1: none)
    must_cut_at: tuple[int, ...] = ()
    """Capture points (sorted, in 1 .. len(prompt)): a prefill chunk ends on one, or crosses it keeping the
    state image there (``engine.prefill_chunks``)."""
    images: tuple[ImageInput, ...] = ()
    """Resized pictures, in prompt order, one per run of image placeholder tokens."""

    # ----- owned by the scheduler ------------------------------------------------
    arrival: int = field(default=-1, init=False)
    state: RequestState = field(default=RequestState.WAITING, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    output_ids: list[int] = field(default_factory=list, init=False)
    lane: int | None = field(default=None, init=False)
    page_table: SequencePages | None = field(default=None, init=False, repr=False)  # while it holds a lane
    num_preemptions: int = field(default=0, init=False)  # preempted to recompute (no lower tier took it)
    live_evictions: int = field(default=0, init=False)  # evicted down a tier (its lane and pages given up)
    live_resumes: int = field(default=0, init=False)  # evicted down a tier and resumed where it stopped
    pages_wanted: int = field(default=0, init=False)  # at the head of its queue: free pages it found too few
    pending_end: tuple[str, ...] | None = field(default=None, init=False)  # (reason, message[, error code])
    kept_tokens: int | None = field(default=None, init=False)  # ended by a stop string: the output tokens it kept
    finish_reason: str | None = field(default=None, init=False)
    cached_tokens: int = field(default=0, init=False)  # prompt tokens resumed from a retained entry
    reuse_kind: str = field(default="none", init=False)
    reuse_slot: str = field(default="none", init=False)
    reuse_tier: str = field(default="none", init=False)
    learned_at: int | None = field(default=None, init=False)  # a learned capture point (a cut too)
    shared_ahead: tuple[int, ...] = field(default=(), init=False)
    """Points where a later arrival shares this prompt while this one has not passed them (cuts too):
    captured so the later one resumes there (``engine.burst_points``)."""
    shared_tokens: int = field(default=0, init=False)  # whole pages shared with an earlier prompt, at arrival
    earlier_cuts: tuple[int, ...] = field(default=(), init=False)  # that earlier prompt's capture points
    shortfall: str = field(default="none", init=False)  # why it reused less than it shares (engine.reuse.shortfall)
    restore_rejected: int = field(default=0, init=False)  # its restores refused for non-finite bytes (recomputed)
    tier_wait_since: float | None = field(default=None, init=False)  # waiting for its lower-tier match since
    tier_wait_s: float = field(default=0.0, init=False)  # how long it waited for lower-tier matches
    evicted: object = field(default=None, init=False, repr=False)  # eviction.Evicted while its state is below
    image_keys: tuple[ImageKey, ...] = field(default=(), init=False, repr=False)
    """Where ``images`` sit in the prompt and their digests, once placed: what reuse reads them as
    (``engine.reuse.image_keys``); empty for a text prompt."""
    salt_chunks: tuple[int, ...] | None = field(default=None, init=False, repr=False)
    image_layout: ImageLayout | None = field(default=None, init=False, repr=False)
    """Where ``images`` sit in the prompt (set when the scheduler accepts the request); every position
    of the request follows from it and the token index, so no resume path needs more."""

    @property
    def reuse_scope(self) -> str | None:
        """What reuse keys are salted with: the client's salt and the adapter (None: neither)."""
        if self.adapter is None:
            return self.cache_salt
        return f"{self.cache_salt or ''}\nlora:{self.adapter}"

    @property
    def rope_delta(self) -> int:
        """Rotary position minus token index of decode steps (0 for a text prompt)."""
        return self.image_layout.delta if self.image_layout is not None else 0

    def __post_init__(self):
        check_str("req_id", self.req_id, 256, allow_empty=False)
        self.prompt_ids = check_token_ids("prompt_ids", self.prompt_ids)
        if not self.prompt_ids:
            raise ValueError(f"request {self.req_id}: the prompt is empty")
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"request {self.req_id}: sampling must be SamplingParams")
        check_choice("request_class", self.request_class, REQUEST_CLASSES)
        cuts = tuple(self.must_cut_at)
        if any(type(c) is not int or not 0 < c <= len(self.prompt_ids) for c in cuts):
            raise ValueError(f"request {self.req_id}: cut points must be in 1..{len(self.prompt_ids)}, got {cuts}")
        self.must_cut_at = tuple(sorted(set(cuts)))
        self.images = tuple(self.images)
        if any(not isinstance(im, ImageInput) for im in self.images):
            raise TypeError(f"request {self.req_id}: images must be ImageInput")
        if self.cache_salt is not None:
            check_str("cache_salt", self.cache_salt, MAX_ID_CHARS, allow_empty=False)
        if self.adapter is not None:
            check_str("adapter", self.adapter, 2 * MAX_ID_CHARS, allow_empty=False)  # a wire name and a digest
        if self.reuse_scope is not None:
            self.salt_chunks = salt_chunks(self.reuse_scope)

    @classmethod
    def from_generate(cls, msg: Generate, page_tokens: int, adapter: str | None = None) -> Request:
        """The request a wire ``Generate`` asks for, with its capture marks as capture points; ``adapter``:
        the identity of its LoRA adapter (``LoraSet.identity``), what its reuse is scoped by."""
        return cls(
            req_id=msg.id, prompt_ids=msg.prompt_ids, sampling=msg.sampling, request_class=msg.request_class,
            system_end=msg.system_end, opener_start=msg.opener_start, last_is_user=msg.last_is_user,
            part_end=msg.part_end, cache_family=msg.cache_family, cache_salt=msg.cache_salt, adapter=adapter,
            images=msg.images,
            must_cut_at=capture_cuts(len(msg.prompt_ids), msg.system_end, msg.opener_start, page_tokens,
                                     msg.part_end),
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def rank(self) -> tuple[int, int]:
        """Sort key: smaller is more important (class first, then earlier arrival)."""
        return CLASS_RANK[self.request_class], self.arrival

    @property
    def has_lane(self) -> bool:
        return self.state in (RequestState.PREFILLING, RequestState.DECODING, RequestState.EVICTING)

    def token_slice(self, start: int, end: int) -> tuple[int, ...]:
        """``tokens[start:end]`` without building the whole token list."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + tuple(self.output_ids[max(0, start - n):end - n])

    def key_prefix(self, end: int) -> tuple[int, ...]:
        """``tokens[:end]`` as reuse compares and hashes them: each image's tokens stand for its digest,
        and a salted request's first tokens carry its salt (``engine.reuse.salt_keys``)."""
        tokens = self.token_slice(0, end)
        keys = key_tokens(tokens, self.image_keys) if self.image_keys else tokens
        return keys if self.salt_chunks is None else salted(keys, self.salt_chunks)

    def place_images(self, keys: tuple[ImageKey, ...], page_tokens: int) -> None:
        """Record where the images sit. A capture never ends inside an image: a cut point (and the mark
        it comes from) inside one moves to the image's start; a system block whose whole pages end inside
        one loses its mark (it holds no image in any template)."""
        scope = self.reuse_scope
        if scope is not None:  # a salted prompt's pictures are keyed by the salt too
            keys = tuple(ImageKey(k.start, k.end, salted_image_digest(scope, k.digest)) for k in keys)
        self.image_keys = keys = tuple(keys)
        if not keys:
            return
        if self.system_end is not None:
            p = self.system_end // page_tokens * page_tokens
            if walk_back(p, keys) != p:
                self.system_end = None
        if self.opener_start is not None:
            self.opener_start = walk_back(self.opener_start, keys)
        if self.part_end is not None:
            self.part_end = walk_back(self.part_end, keys)
        self.must_cut_at = walk_back_all(self.must_cut_at, keys)

    def token_at(self, position: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]
