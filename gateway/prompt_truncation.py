"""vLLM's ``truncate_prompt_tokens``: keep only a prompt's last tokens (left truncation).

``k`` >= 1 keeps the last ``k`` tokens (at most ``max_model_len``: more is a
400, as in vLLM); -1 keeps the last ``max_model_len``
(the most the model takes; the completion then needs room of its own, as
without truncation). A chat prompt is cut after rendering, so what is lost is
the start of the rendered conversation (its system block first). Capture
marks move with the cut; one that falls in the dropped part is gone and named
in the request's ``mark_missing`` (``system_end: truncated``), so the engine's
done line says so. A cut that drops any image token is a 400 (the request's
pictures travel whole, one per run of pad tokens). No torch.
"""

from __future__ import annotations

from ignis.gateway.errors import invalid

MARKS = ("system_end", "opener_start", "part_end")
PARAM = "truncate_prompt_tokens"


def kept_tokens(requested: int, max_model_len: int, max_tokens: int | None = None) -> int:
    """How many tokens ``truncate_prompt_tokens`` keeps; more than the model's length is a 400 (vLLM's). -1
    keeps what leaves room for ``max_tokens`` (at least one token) in the model's length, as vLLM does."""
    if requested > max_model_len:
        raise invalid(f"{PARAM} value ({requested}) is greater than max_model_len ({max_model_len}): request a "
                      f"smaller truncation size, or -1 for the model's length less max_tokens", PARAM)
    if requested == -1:
        return max(1, max_model_len - max(1, max_tokens or 1))
    return requested


def truncate(ids: list[int], keep: int, marks: dict | None = None, image_pad: int | None = None
             ) -> tuple[list[int], dict | None]:
    """``ids`` cut to their last ``keep`` tokens, and ``marks`` (a Generate's mark fields) moved with them."""
    cut = len(ids) - keep
    if cut <= 0:
        return ids, marks
    if image_pad is not None and image_pad in ids[:cut]:
        raise invalid(f"{PARAM} ({keep}) would drop an image's tokens: keep more tokens, or send the "
                      "conversation without the images before the cut", PARAM)
    if marks is None:
        return ids[cut:], None
    out = dict(marks)
    lost = []
    for name in MARKS:
        mark = marks.get(name)
        if mark is None:
            continue
        out[name] = mark - cut if mark - cut > 0 else None
        if out[name] is None:
            lost.append(f"{name}: truncated")
    if lost:
        out["mark_missing"] = "; ".join(filter(None, [marks.get("mark_missing"), *lost]))
    return ids[cut:], out
