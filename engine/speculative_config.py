"""vLLM's ``--speculative-config`` JSON read as ignis's speculative flags.

vLLM's Qwen3.5 and Qwen3-Next recipes start the model's built-in drafter with
``--speculative-config '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'``
(or ``"mtp"``). ignis drafts with the same multi-token-prediction head, so such
a config means ``--speculative-tokens 2``. ``"method": "ngram"`` (vLLM's
prompt lookup, with its ``prompt_lookup_min`` / ``prompt_lookup_max``) means
``--speculative-method ngram`` (``engine.ngram_drafter``). A drafter ignis does
not have (``eagle``, ``eagle3``, ``medusa``, a separate draft ``model``) or a key
it would not honour is refused by name instead of being ignored. Pure Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FLAG = "--speculative-config"
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
NGRAM_METHODS = ("ngram",)
METHODS = ("mtp", "ngram")  # --speculative-method
COUNT = "num_speculative_tokens"
LOOKUP_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
LOOKUP_DEFAULT = 5  # vLLM's n-gram bounds when neither is given
# keys that say nothing ignis does not do when they hold these values
NEUTRAL = {"model": None, "draft_tensor_parallel_size": 1}


@dataclass(frozen=True)
class SpeculativeChoice:
    """What a config asks for: the drafter (``mtp`` or ``ngram``), draft tokens per step, and prompt
    lookup's n-gram bounds (None: not given)."""

    method: str
    tokens: int
    lookup_min: int | None = None
    lookup_max: int | None = None


def lookup_bounds(lookup_min: int | None, lookup_max: int | None, default: int) -> tuple[int, int]:
    """vLLM's rule: neither given, both ``default``; one given, both it."""
    if lookup_min is None and lookup_max is None:
        return default, default
    if lookup_min is None:
        return lookup_max, lookup_max
    if lookup_max is None:
        return lookup_min, lookup_min
    return lookup_min, lookup_max


def read_speculative_config(text: str) -> SpeculativeChoice:
    """The choice ``text`` (vLLM's JSON) makes; ValueError naming the flag when ignis would not honour it."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{FLAG}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{FLAG} must be a JSON object like '{{\"method\": \"mtp\", \"{COUNT}\": 2}}'")
    method = obj.get("method", "mtp")
    if method not in MTP_METHODS + NGRAM_METHODS:
        raise ValueError(f"{FLAG}: method {method!r} is not served: ignis drafts with the checkpoint's own "
                         f"multi-token-prediction head ({', '.join(MTP_METHODS)}) or by prompt lookup (ngram)")
    count = obj.get(COUNT)
    if type(count) is not int or count < 1:
        raise ValueError(f"{FLAG}: {COUNT} must be a positive integer, got {count!r}")
    taken = ("method", COUNT) + (LOOKUP_KEYS if method in NGRAM_METHODS else ())
    other = sorted(k for k, v in obj.items() if k not in taken and NEUTRAL.get(k, ...) != v)
    if other:
        raise ValueError(f"{FLAG}: {', '.join(other)} not taken (only {', '.join(taken)})")
    if method in MTP_METHODS:
        return SpeculativeChoice("mtp", count)
    bounds = [obj.get(key) for key in LOOKUP_KEYS]
    for key, value in zip(LOOKUP_KEYS, bounds):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{FLAG}: {key} must be a positive integer, got {value!r}")
    return SpeculativeChoice("ngram", count, *bounds)
