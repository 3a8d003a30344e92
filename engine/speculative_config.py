"""vLLM's ``--speculative-config`` JSON read as ignis's ``--speculative-tokens``.

vLLM's Qwen3.5 and Qwen3-Next recipes start the model's built-in drafter with
``--speculative-config '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'``
(or ``"mtp"``). ignis drafts with the same multi-token-prediction head, so such
a config means ``--speculative-tokens 2``. A drafter ignis does not have
(``ngram``, ``eagle``, ``eagle3``, ``medusa``, a separate draft ``model``) or a key
it would not honour is refused by name instead of being ignored. Pure Python.
"""

from __future__ import annotations

import json

FLAG = "--speculative-config"
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
COUNT = "num_speculative_tokens"
# keys that say nothing ignis does not do when they hold these values
NEUTRAL = {"model": None, "draft_tensor_parallel_size": 1}


def speculative_tokens_of(text: str, speculative_tokens: int = 0) -> int:
    """The draft tokens per step ``text`` asks for; a ``--speculative-tokens`` other than 0 must agree."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{FLAG}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{FLAG} must be a JSON object like '{{\"method\": \"mtp\", \"{COUNT}\": 2}}'")
    method = obj.get("method", "mtp")
    if method not in MTP_METHODS:
        raise ValueError(f"{FLAG}: method {method!r} is not served: ignis drafts with the checkpoint's own "
                         f"multi-token-prediction head only ({', '.join(MTP_METHODS)})")
    count = obj.get(COUNT)
    if type(count) is not int or count < 1:
        raise ValueError(f"{FLAG}: {COUNT} must be a positive integer, got {count!r}")
    other = sorted(k for k, v in obj.items() if k not in ("method", COUNT) and NEUTRAL.get(k, ...) != v)
    if other:
        raise ValueError(f"{FLAG}: {', '.join(other)} not taken (only method and {COUNT})")
    if speculative_tokens not in (0, count):
        raise ValueError(f"{FLAG} asks for {count} draft tokens and --speculative-tokens for {speculative_tokens}")
    return count
