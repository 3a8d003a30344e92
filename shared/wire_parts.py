"""Value types nested inside engine -> gateway messages (``shared.wire``).

``StreamTokens`` and ``TokenLogprobs`` make up a ``TokenBatch``; ``Usage``,
``ReuseInfo`` and ``Timings`` make up a ``Finished``. Each checks its fields
when built. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.shared.wire_fields import (
    MAX_INT,
    check_choice,
    check_float,
    check_int,
    check_str,
    check_token_ids,
    logprobs_from_json,
    logprobs_to_json,
)

MAX_STREAM_ID_CHARS = 256
REUSE_KINDS = ("none", "retained_prefix", "prompt_checkpoint", "part_boundary", "learned_point", "aborted_prefill")
REUSE_TIERS = ("none", "device", "kv_ram", "kv_disk")
MAX_MS = 1e12


@dataclass(frozen=True)
class TokenLogprobs:
    """Log probabilities of one stream's new tokens in one round.

    Layout, one entry per new token i (all three tuples have that length):
        logprobs[i]       the chosen token's log probability
        top_ids[i]        the most likely alternatives, best first (top_logprobs of them)
        top_logprobs[i]   their log probabilities, parallel to top_ids[i]
    A probability of zero is -inf (null on the wire).
    """

    logprobs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        n = len(self.logprobs) if isinstance(self.logprobs, (list, tuple)) else -1
        if n < 0 or not isinstance(self.top_ids, (list, tuple)) or not isinstance(self.top_logprobs, (list, tuple)):
            raise TypeError("logprobs, top_ids and top_logprobs must be lists")
        if len(self.top_ids) != n or len(self.top_logprobs) != n:
            raise ValueError("logprobs, top_ids and top_logprobs must have one entry per token")
        # logprobs_from_json maps None (the wire's -inf) and checks every value.
        lps = logprobs_from_json("logprobs", list(self.logprobs))
        ids, tops = [], []
        for i, (row_ids, row_lps) in enumerate(zip(self.top_ids, self.top_logprobs)):
            row_ids = check_token_ids(f"top_ids[{i}]", row_ids, max_len=64)
            if not isinstance(row_lps, (list, tuple)) or len(row_lps) != len(row_ids):
                raise ValueError(f"top_logprobs[{i}] must parallel top_ids[{i}]")
            ids.append(row_ids)
            tops.append(logprobs_from_json(f"top_logprobs[{i}]", list(row_lps)))
        object.__setattr__(self, "logprobs", lps)
        object.__setattr__(self, "top_ids", tuple(ids))
        object.__setattr__(self, "top_logprobs", tuple(tops))

    @property
    def num_tokens(self) -> int:
        return len(self.logprobs)

    def to_json(self) -> dict:
        return {
            "logprobs": logprobs_to_json(self.logprobs),
            "top_ids": [list(r) for r in self.top_ids],
            "top_logprobs": [logprobs_to_json(r) for r in self.top_logprobs],
        }

    @classmethod
    def from_json(cls, obj: object) -> TokenLogprobs:
        if type(obj) is not dict or obj.keys() != {"logprobs", "top_ids", "top_logprobs"}:
            raise ValueError("a logprobs entry must be an object with logprobs, top_ids, top_logprobs")
        # null entries (-inf) are mapped by the constructor's checks.
        return cls(logprobs=obj["logprobs"], top_ids=obj["top_ids"], top_logprobs=obj["top_logprobs"])


@dataclass(frozen=True)
class StreamTokens:
    """One stream's share of a TokenBatch: at least one new token."""

    id: str
    token_ids: tuple[int, ...]
    logprobs: TokenLogprobs | None = None

    def __post_init__(self):
        check_str("stream id", self.id, MAX_STREAM_ID_CHARS, allow_empty=False)
        ids = check_token_ids("token_ids", self.token_ids)
        if not ids:
            raise ValueError(f"stream {self.id!r} has no tokens")
        object.__setattr__(self, "token_ids", ids)
        if self.logprobs is not None:
            if not isinstance(self.logprobs, TokenLogprobs):
                raise TypeError("logprobs must be TokenLogprobs or None")
            if self.logprobs.num_tokens != len(ids):
                raise ValueError(f"stream {self.id!r} has {len(ids)} tokens but {self.logprobs.num_tokens} logprobs")


@dataclass(frozen=True)
class Usage:
    """Token counts of a finished stream; ``cached_tokens`` is the resumed part of the prompt."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def __post_init__(self):
        check_int("prompt_tokens", self.prompt_tokens, 0, MAX_INT)
        check_int("completion_tokens", self.completion_tokens, 0, MAX_INT)
        check_int("cached_tokens", self.cached_tokens, 0, MAX_INT)
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError(f"cached_tokens ({self.cached_tokens}) exceeds prompt_tokens ({self.prompt_tokens})")


@dataclass(frozen=True)
class ReuseInfo:
    """What a stream resumed from: the kind of retained state and the tier it came from."""

    kind: str = "none"  # one of REUSE_KINDS
    tier: str = "none"  # one of REUSE_TIERS

    def __post_init__(self):
        check_choice("reuse kind", self.kind, REUSE_KINDS)
        check_choice("reuse tier", self.tier, REUSE_TIERS)
        if (self.kind == "none") != (self.tier == "none"):
            raise ValueError(f"reuse kind {self.kind!r} and tier {self.tier!r} must both be 'none' or neither")


@dataclass(frozen=True)
class Timings:
    """Milliseconds: waiting in the queue, prefilling, and arrival to first token."""

    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0

    def __post_init__(self):
        for name in ("queue_ms", "prefill_ms", "ttft_ms"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), 0.0, MAX_MS))
