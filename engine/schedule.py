"""The scheduler/runner boundary: what one round computes, and what it produced.

Plain dataclasses, no torch, self-contained (token ids and page tables are in
the plan), so a plan can be built on the CPU in tests, handed to the runner,
or broadcast to other ranks.

A round, as the engine loop drives it:

    plan   = scheduler.schedule()        # RoundPlan
    result = runner.run(plan)            # RoundResult: one token per sampled sequence
    ended  = scheduler.update(result)    # list[FinishEvent]

Order inside a round matches the runner's packed batch: every decode first
(one token each, in ``decodes`` order), then every prefill chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.engine.image_layout import ImageLayout
from ignis.shared.sampling import SamplingParams



@dataclass(frozen=True)
class LaneStart:
    """A request that takes ``lane`` this round: the runner resets the lane's recurrent
    state before its first chunk and sets up its sampler.

    ``generated`` is empty for a new request. For one resuming after a
    preemption it holds the output so far (already streamed); the runner keeps
    the request's sampler state from before the preemption, so the resumed
    request draws exactly as it would have.
    """

    req_id: str
    lane: int
    sampling: SamplingParams
    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...] = ()
    restore_slot: int | None = None
    """Resume from a retained entry: copy this slot's state image into the lane instead of zeroing it."""
    adapter: int = -1
    """The LoRA adapter slot the lane's rows take (``engine.models.lora``); -1: none."""


@dataclass(frozen=True)
class PrefillChunk:
    """Positions ``start .. end-1`` of a request (``token_ids``, ``end - start`` of them).

    ``is_last``: the chunk reaches the end of the request's tokens, so the
    runner samples its next token from the last position. ``pages`` is the
    request's whole page table; it covers at least ``end`` positions.
    """

    req_id: str
    lane: int
    start: int
    end: int
    is_last: bool
    token_ids: tuple[int, ...]
    pages: tuple[int, ...]
    layout: ImageLayout | None = None
    """The request's images and where they sit (None: a text prompt); the runner encodes the images
    this chunk touches and gives its tokens their mRoPE positions."""
    keeps: tuple[tuple[int, int], ...] = ()
    """(point, slot): capture marks inside the chunk (start < point < end, increasing); the forward
    keeps the lane's state image after ``point`` tokens in ``slot`` as it passes."""

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class DecodeItem:
    """One decode step: feed ``token_id`` at ``position`` and sample the next token.
    ``pages`` covers at least ``position + 1 + room`` positions.

    ``room``: draft tokens the runner may verify after ``token_id`` this round
    (speculative decoding, ``engine.spec_decode``); each accepted one is a further
    output token (``RoundResult.extra``). 0: a plain step."""

    req_id: str
    lane: int
    position: int
    token_id: int
    pages: tuple[int, ...]
    room: int = 0
    rope_delta: int = 0
    """Rotary position minus ``position`` (mRoPE: the shift the prompt's images leave; 0 for text)."""


@dataclass(frozen=True)
class Preempted:
    """A request that lost its lane and pages this round (it recomputes later)."""

    req_id: str
    lane: int


@dataclass(frozen=True)
class FinishEvent:
    """A request that ended: why, and its token counts."""

    req_id: str
    reason: str  # one of shared.wire.FINISH_REASONS
    prompt_tokens: int
    completion_tokens: int
    message: str = ""
    error_code: str = ""  # with reason "error": "invalid_request" when the request's own constraints failed it
    cached_tokens: int = 0
    reuse_kind: str = "none"  # "none" or one of engine.reuse.entries.KINDS
    reuse_tier: str = "none"  # "none" | "device"
    reuse_slot: str = "none"  # where the resumed image sat: "none" | "device" | "host"
    shortfall: str = "none"  # why it reused less than it shares with an earlier prompt (engine.reuse.shortfall)
    restore_rejected: int = 0  # restores refused for non-finite bytes (it recomputed instead)
    tier_wait_s: float = 0.0  # how long it waited for its lower-tier match to be looked up and copied back
    live_evictions: int = 0  # times it was evicted down a tier (whether or not it resumed)
    live_resumes: int = 0  # times it was evicted down a tier and resumed bit-exact where it stopped
    recomputed: int = 0  # times it gave up its lane and computed its tokens again (preempted, or its copies lost)


@dataclass
class RoundPlan:
    """Everything the runner needs for one round, plus what ended at its start."""

    decodes: list[DecodeItem] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    started: list[LaneStart] = field(default_factory=list)
    preempted: list[Preempted] = field(default_factory=list)
    finished: list[FinishEvent] = field(default_factory=list)
    """Requests freed at this round boundary (running requests aborted since the last round)."""
    copies_before: list[tuple[int, int]] = field(default_factory=list)
    """KV page copies (src, dst) to make before the forward: private copies of resumed partial pages."""
    captures: list = field(default_factory=list)
    """``CaptureOrder``s to carry out after the forward (those ``before_round``: before anything else):
    page copies, then lane -> slot image copies."""

    @property
    def is_empty(self) -> bool:
        """Nothing to run: no forward and no capture (``finished`` and ``preempted`` may still be
        non-empty). A plan that only captures is run and updated like one that computes."""
        return not self.decodes and not self.prefills and not self.captures

    @property
    def computes(self) -> bool:
        """Whether the round has a forward (a decode or a prefill chunk)."""
        return bool(self.decodes or self.prefills)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    def sampled_ids(self) -> list[str]:
        """The requests that get a token this round: every decode, then every last chunk."""
        return [d.req_id for d in self.decodes] + [c.req_id for c in self.prefills if c.is_last]


@dataclass
class RoundResult:
    """The runner's answer to a plan: the token sampled for each of ``plan.sampled_ids()``.

    Stop and length decisions are the scheduler's (it knows max_tokens, stop
    ids, EOS and the model length); the runner only samples.
    """

    tokens: dict[str, int] = field(default_factory=dict)
    extra: dict[str, list[int]] = field(default_factory=dict)
    """Speculative decodes: the tokens accepted after ``tokens[req_id]`` (at most the item's ``room``),
    in order. ``Scheduler.update`` cuts a list where its request ends (stop token, length), so after
    it the lists hold exactly the tokens the requests took."""
    drafted: dict[str, int] = field(default_factory=dict)
    """Speculative decodes: how many draft tokens each verified (``extra`` holds those accepted)."""
    prompt_logprobs: dict[str, list] = field(default_factory=dict)
    """Requests that score their prompt: this round's scores (``shared.wire.PromptLogprobs`` messages, in
    prompt order), sent before any of their tokens."""
    errors: dict[str, str] = field(default_factory=dict)
    """Requests whose step failed this round (e.g. sampling): each ends with "error" and this message;
    its entry in ``tokens`` is a placeholder that is never used."""
    invalid: set[str] = field(default_factory=set)
    """Of ``errors``, the requests that failed by their own constraints (no token left to sample): their
    error is the client's (``shared.wire.Finished.error_code``)."""
