"""Content hashes of token prefixes: a chain over full pages.

    h_0 = SEED
    h_k = blake2b(h_{k-1} || page_k tokens as int32)

``h_k`` names the first k full pages of a prefix and nothing else, so two
prompts share ``h_k`` exactly when (up to a hash collision, ruled out by the
token-by-token check every caller makes) their first ``k * 64`` tokens are
equal. Callers hash a prompt's key tokens (``engine.reuse.image_keys``): the
tokens of an image are ids drawn from its content digest, so the page that
holds an image hashes its identity, and the same tokens with another picture
hash differently from that page on.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

SEED = b"ignis-prefix-v1"


def chain(parent: bytes, page_tokens: Sequence[int]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("i", page_tokens).tobytes())
    return h.digest()


MEMO_CHAINS = 4
"""Chains remembered by the tuple they were made of: a request's prompt is hashed by its lookup, by the
check of captures pending for it and by the learned points, and again every round while it waits for
pages (a 120K-token prompt's chain costs ~5 ms); a tuple of the same identity is the same tokens."""
_memo: OrderedDict[int, tuple[tuple, int, list[bytes]]] = OrderedDict()
_memo_lock = threading.Lock()


def page_chain(tokens: Sequence[int], page_tokens: int, limit: int | None = None) -> list[bytes]:
    """``[h_0, h_1, ..., h_K]`` for the full pages of ``tokens`` (at most ``limit`` pages)."""
    full = len(tokens) // page_tokens
    n = full if limit is None else min(full, limit)
    if type(tokens) is not tuple:
        return _chain_of(tokens, page_tokens, n)
    with _memo_lock:
        hit = _memo.get(id(tokens))
        if hit is not None and hit[0] is tokens and hit[1] == page_tokens:
            _memo.move_to_end(id(tokens))
            return hit[2][:n + 1]
        for longer, pt, known in reversed(_memo.values()):  # a capture's tokens: a prefix of its request's
            if pt == page_tokens and len(longer) >= len(tokens) and longer[:len(tokens)] == tokens:
                return known[:n + 1]
    out = _chain_of(tokens, page_tokens, full)
    with _memo_lock:
        _memo[id(tokens)] = (tokens, page_tokens, out)  # the tuple is held: its id is not reused meanwhile
        _memo.move_to_end(id(tokens))
        while len(_memo) > MEMO_CHAINS:
            _memo.popitem(last=False)
    return out[:n + 1]


def _chain_of(tokens: Sequence[int], page_tokens: int, full: int) -> list[bytes]:
    out = [SEED]
    for k in range(full):
        out.append(chain(out[-1], tokens[k * page_tokens:(k + 1) * page_tokens]))
    return out
