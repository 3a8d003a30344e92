"""vLLM's ``--speculative-config`` JSON read as ignis's speculative flags.

vLLM's Qwen3.5 and Qwen3-Next recipes start the model's built-in drafter with
``--speculative-config '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'``
(or ``"mtp"``). ignis drafts with the same multi-token-prediction head, so such
a config means ``--speculative-tokens 2``. ``"method": "ngram"`` (vLLM's
prompt lookup, with its ``prompt_lookup_min`` / ``prompt_lookup_max``) means
``--speculative-method ngram`` (``engine.ngram_drafter``). A drafter ignis does
not have (``eagle``, ``eagle3``, ``medusa``, a separate draft ``model``) or a key
it would not honour is refused by name instead of being ignored.

SGLang's flags say the same things another way (``sglang_choice``): its
Qwen3.5 recipe's ``--speculative-algorithm NEXTN --speculative-num-steps 3
--speculative-eagle-topk 1 --speculative-num-draft-tokens 4`` is the head
drafting 3 tokens (a chain: top-k 1; the draft tokens count the verified
token before them), and ``NGRAM`` with ``--speculative-num-draft-tokens D``
and its match window sizes is prompt lookup of D - 1 tokens. Tree drafting
(top-k above 1) and other algorithms are refused by name. Pure Python.
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
BATCH_KEY = "disable_by_batch_size"  # vLLM's: no speculation in rounds of this many decoding lanes or more
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
    disable_by_batch_size: int | None = None


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
    taken = ("method", COUNT, BATCH_KEY) + (LOOKUP_KEYS if method in NGRAM_METHODS else ())
    other = sorted(k for k, v in obj.items() if k not in taken and NEUTRAL.get(k, ...) != v)
    if other:
        raise ValueError(f"{FLAG}: {', '.join(other)} not taken (only {', '.join(taken)})")
    off = obj.get(BATCH_KEY)
    if off is not None and (type(off) is not int or off < 1):
        raise ValueError(f"{FLAG}: {BATCH_KEY} must be a positive integer, got {off!r}")
    if method in MTP_METHODS:
        return SpeculativeChoice("mtp", count, disable_by_batch_size=off)
    bounds = [obj.get(key) for key in LOOKUP_KEYS]
    for key, value in zip(LOOKUP_KEYS, bounds):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{FLAG}: {key} must be a positive integer, got {value!r}")
    return SpeculativeChoice("ngram", count, *bounds, disable_by_batch_size=off)


SGLANG_MTP = ("NEXTN", "EAGLE", "MTP")  # with a Qwen3.5 / Qwen3-Next checkpoint: its own head
SGLANG_STEPS = 3  # SGLang's choice for an MTP checkpoint when no count is given
SGLANG_NGRAM_DRAFTS = 4  # draft tokens of NGRAM when --speculative-num-draft-tokens is not given
SGLANG_NGRAM_WINDOW = (1, 12)  # SGLang's match window defaults


def sglang_choice(algorithm: str, num_steps: int | None = None, eagle_topk: int | None = None,
                  num_draft_tokens: int | None = None, min_window: int | None = None,
                  max_window: int | None = None) -> SpeculativeChoice:
    """SGLang's speculative flags as ignis's choice (ValueError naming the flag when not honoured)."""
    name = algorithm.upper()
    for flag, value in (("--speculative-num-steps", num_steps), ("--speculative-eagle-topk", eagle_topk),
                        ("--speculative-num-draft-tokens", num_draft_tokens),
                        ("--speculative-ngram-min-match-window-size", min_window),
                        ("--speculative-ngram-max-match-window-size", max_window)):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{flag} must be a positive integer, got {value!r}")
    if name in SGLANG_MTP:
        if eagle_topk not in (None, 1):
            raise ValueError(f"--speculative-eagle-topk {eagle_topk}: ignis drafts one chain (top-k 1), not a tree")
        if min_window is not None or max_window is not None:
            raise ValueError(f"--speculative-ngram-*-match-window-size go with --speculative-algorithm NGRAM, "
                             f"not {algorithm}")
        if num_steps is not None:
            return SpeculativeChoice("mtp", num_steps)
        return SpeculativeChoice("mtp", num_draft_tokens - 1 if num_draft_tokens and num_draft_tokens > 1
                                 else SGLANG_STEPS)
    if name == "NGRAM":
        if num_draft_tokens is not None and num_draft_tokens < 2:
            raise ValueError(f"--speculative-num-draft-tokens {num_draft_tokens}: it counts the verified token "
                             f"before the drafts, so at least 2")
        low = min_window if min_window is not None else SGLANG_NGRAM_WINDOW[0]
        high = max_window if max_window is not None else max(low, SGLANG_NGRAM_WINDOW[1])
        drafts = num_draft_tokens - 1 if num_draft_tokens is not None else SGLANG_NGRAM_DRAFTS
        return SpeculativeChoice("ngram", drafts, low, high)
    raise ValueError(f"--speculative-algorithm {algorithm}: not served; ignis drafts with the checkpoint's own "
                     f"multi-token-prediction head ({', '.join(SGLANG_MTP)}) or by prompt lookup (NGRAM)")
