"""Content hashes of token prefixes: a chain over full pages.

    h_0 = SEED
    h_k = blake2b(h_{k-1} || page_k tokens as int32 || extra ids of page k)

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
from array import array
from collections.abc import Sequence

SEED = b"ignis-prefix-v1"


def chain(parent: bytes, page_tokens: Sequence[int], extra: Sequence[int] = ()) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("i", page_tokens).tobytes())
    if extra:
        h.update(b"|")
        h.update(array("q", extra).tobytes())
    return h.digest()


def page_chain(tokens: Sequence[int], page_tokens: int, limit: int | None = None) -> list[bytes]:
    """``[h_0, h_1, ..., h_K]`` for the full pages of ``tokens`` (at most ``limit`` pages)."""
    full = len(tokens) // page_tokens
    if limit is not None:
        full = min(full, limit)
    out = [SEED]
    for k in range(full):
        out.append(chain(out[-1], tokens[k * page_tokens:(k + 1) * page_tokens]))
    return out
