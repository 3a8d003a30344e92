"""The Responses API's ``truncation: "auto"``: a conversation past the context loses its earliest turns.

OpenAI drops items from the beginning of the conversation until the input
fits the context. Here the leading system (and developer) messages stay, and
the conversation after them is cut just before one of its user messages: the
earliest cut whose rendered prompt fits, found by bisection (a few renders,
not one per message). So the kept part opens with a user turn (Qwen's
templates refuse a conversation without one) and keeps every tool result with
the call it answers. When even the last user turn onward does not fit, the
conversation stays whole and the request fails as it would without
truncation (``context_length_exceeded``). The instructions and the tools stay,
so the retained prefix prompt reuse keeps (the system + tools block) still
serves the cut conversation.

The cut leaves room for the answer: ``max_output_tokens`` when the request
gives it, else ``answer_room`` (an eighth of the context, at most 8,192
tokens): cut to leave one token free, an agent's next turn would stop at once
with ``incomplete``.

Pure Python over a ``length_of(messages)`` callback (the rendered prompt's
token count).
"""

from __future__ import annotations

from collections.abc import Callable

LEADING = ("system", "developer")


def answer_room(max_model_len: int) -> int:
    """The tokens a cut leaves free for an answer whose length the request does not bound."""
    return max(1, min(8192, max_model_len // 8))


def cut_points(messages: list[dict]) -> tuple[int, list[int]]:
    """(the number of leading system messages, the indices of the later user messages a cut may keep from)."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in LEADING:
        lead += 1
    first_user = next((i for i in range(lead, len(messages)) if messages[i].get("role") == "user"), None)
    points = [i for i in range(lead, len(messages)) if messages[i].get("role") == "user" and i != first_user]
    return lead, points


def fit_messages(messages: list[dict], length_of: Callable[[list[dict]], int], budget: int
                 ) -> tuple[list[dict], int]:
    """(``messages`` with the fewest earliest turns dropped so that ``length_of`` is at most ``budget``, the
    number of messages dropped); the messages unchanged (0) when they fit or no cut does."""
    if length_of(messages) <= budget:
        return messages, 0
    lead, points = cut_points(messages)

    def cut(i: int) -> list[dict]:
        return messages[:lead] + messages[i:]

    lo, hi, best = 0, len(points) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if length_of(cut(points[mid])) <= budget:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    if best is None:
        return messages, 0
    return cut(points[best]), points[best] - lead
