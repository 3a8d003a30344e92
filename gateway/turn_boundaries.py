"""Where a turn starts in a rendered prompt's token ids: the message boundaries capture marks are cut at.

Two renders that differ only in one message share a token prefix that runs
into that message's header and stops inside its content:

    ... system text <|im_end|> \\n <|im_start|> user \\n | A ...      render with probe A
    ... system text <|im_end|> \\n <|im_start|> user \\n | B ...      render with probe B
                                   ^ turn start          ^ common prefix ends

``turn_start`` cuts such a prefix back to the start of the header: the added
token (``<|im_start|>``, ``<|start_header_id|>``, ``[INST]``...) at or before
the token naming the role, looked for among the last ``HEADER_TOKENS``
tokens; without a role name, the last added token there. Added tokens are
split off before any merge, so the text before a turn start always
tokenizes the same way, whatever follows it. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

HEADER_TOKENS = 8
"""Longest turn header (in tokens) a boundary is searched in: role name, added tokens, newlines."""


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences (token ids, or strings)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def turn_start(ids: Sequence[int], end: int, added: Collection[int], names_role: Callable[[int], bool]) -> int | None:
    """Index of the token that opens the turn whose header ends ``ids[:end]``; None when there is none.

    ``added`` holds the tokenizer's added token ids; ``names_role(token_id)``
    says a token spells the role of that turn (``user``, ``assistant``).
    """
    lo = max(0, end - HEADER_TOKENS)
    last = end - 1
    for i in range(end - 1, lo - 1, -1):
        if names_role(ids[i]):
            last = i
            break
    for i in range(last, lo - 1, -1):
        if ids[i] in added:
            return i
    return None
