"""OpenAI's reasoning effort (chat's ``reasoning_effort``, the Responses API's ``reasoning.effort``) as
template variables.

Qwen3.5's and Qwen3-Next's templates know no effort, only whether the model
thinks first: ``enable_thinking`` is false for ``none`` and ``minimal`` and
true for the rest, unless the request's ``chat_template_kwargs`` set it. The
effort itself goes to the template too, as ``reasoning_effort`` (vLLM passes
it so), for templates that read it. Pure Python.
"""

from __future__ import annotations

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
NO_THINKING = ("none", "minimal")


def with_effort(kwargs: dict, effort: str | None) -> dict:
    """``kwargs`` (the template variables a request gave) with what ``effort`` says, where they are silent."""
    if effort is None:
        return kwargs
    out = dict(kwargs)
    out.setdefault("enable_thinking", effort not in NO_THINKING)
    out.setdefault("reasoning_effort", effort)
    return out
