"""A cache salt in reuse keys: salted prompts share retained state only with the same salt.

A client that sends ``cache_salt`` (vLLM's field; the gateway passes the
engine a digest of it, never the salt) asks that its prompts reuse only state
made by requests with the same salt, so a tenant without the salt can neither
resume from that state nor tell from its time to first token that the prefix
was seen. Reuse compares and hashes a prompt's *key tokens*
(``Request.key_prefix``: the retained store, the lower tiers' records and
tierd keys, learned and shared capture points, block events' hashes, the
fates of captures), so the salt lives there: the first ``SALT_POSITIONS``
text positions of a salted prompt's key tokens each fold in ``SALT_BITS``
bits of a stream drawn from the salt digest, beside the whole token id:

    key id at position j < 32 = -1 - (chunk[j] << TOKEN_BITS | token)
    chunk[j] = byte j of shake_256(salt digest) & 0x7F

The map is one to one for a fixed salt (the token id is kept whole), so two
prompts with one salt share exactly the key prefixes their tokens share; key
ids are negative, so a salted key never equals an unsalted one (text ids are
>= 0, image key ids >= 2^30), and prompts with different salts differ from
their first token on except with probability 2^-7 per salted position
(2^-224 past 32 tokens; a prefix short enough to be guessed, such as the
template's opening tokens, carries no secret). The images of a salted prompt
take key ids from a digest of the salt and the picture
(``salted_image_digest``), so an image's run carries the salt too.

Positions past the first 32 keep their ids: equality of two key prefixes is
decided over all their positions, the salted ones among them. Token ids must
be below ``2^TOKEN_BITS`` (every vocabulary is). Pure Python, no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ignis.engine.reuse.image_keys import KEY_BASE

SALT_POSITIONS = 32
SALT_BITS = 7
TOKEN_BITS = 24
MAX_SALTED_TOKEN = (1 << TOKEN_BITS) - 1
_DOMAIN = b"ignis-cache-salt\n"


def salt_chunks(salt: str) -> tuple[int, ...]:
    """The ``SALT_POSITIONS`` chunks a salt digest folds into key ids, each below ``2^SALT_BITS``."""
    stream = hashlib.shake_256(_DOMAIN + salt.encode()).digest(SALT_POSITIONS)
    return tuple(b & ((1 << SALT_BITS) - 1) for b in stream)


def salted(keys: Sequence[int], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """``keys`` (key tokens) with their first text positions salted; image key ids are left as they are."""
    head = min(len(keys), SALT_POSITIONS)
    out = list(keys[:head])
    for j, t in enumerate(out):
        if t > MAX_SALTED_TOKEN:
            if t < KEY_BASE:
                raise ValueError(f"token id {t} is too large to salt (at most {MAX_SALTED_TOKEN})")
            continue  # an image key id: its digest carries the salt (salted_image_digest)
        if t < 0:
            raise ValueError(f"key id {t} at position {j} is salted already")
        out[j] = -1 - ((chunks[j] << TOKEN_BITS) | t)
    return tuple(out) + tuple(keys[head:])


def raw_token(key: int) -> int:
    """The token id a salted key id stands for (any other id is returned as it is)."""
    return (-1 - key) & MAX_SALTED_TOKEN if key < 0 else key


def salted_image_digest(salt: str, digest: bytes) -> bytes:
    """The digest an image of a salted prompt is keyed by: the salt's and the picture's."""
    return hashlib.blake2b(_DOMAIN + salt.encode() + b"\n" + digest, digest_size=len(digest)).digest()
