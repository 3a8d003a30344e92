"""Images in reuse keys: a prompt's image tokens stand for the image's content digest.

Every image takes one run of identical ``<|image_pad|>`` tokens, so two prompts
with different pictures of the same size have the same token ids. Wherever
reuse compares or hashes a prompt (the retained store's lookups and captures,
the page chain of ``engine.reuse.hashing``, the lower tiers' records, learned
points), it reads the prompt's *key tokens* instead: the token ids with each
image's run replaced by ids drawn from that image's digest
(``shared.image_input``):

    key id of the j-th token of an image = KEY_BASE | chunk[j mod 5]
    chunk[i] = bits 30*i .. 30*i + 29 of the 128-bit digest (little-endian; the 5th holds the last 8)

Key ids are at least ``KEY_BASE`` (2^30), above every vocabulary, and below
2^31, so they travel in the int32 frames and pages hash them like any token.
The page holding an image's token therefore hashes its digest, the token-by-token
check of every candidate compares it, the same picture in a later turn
matches, and a different picture of the same size does not, from its first
token on. An image of five tokens or more puts all 128 bits of its digest in
its keys (four tokens 120 bits, one token 30).

A capture point never ends inside an image (resuming there would need part of
an image's embeddings): ``walk_back`` moves a cut inside one to the image's
start. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

KEY_BASE = 1 << 30
_CHUNK_BITS = 30
_CHUNKS = 5
_MASK = (1 << _CHUNK_BITS) - 1


@dataclass(frozen=True)
class ImageKey:
    """One image's place in a prompt, ``start .. end - 1``, and its content digest."""

    start: int
    end: int
    digest: bytes

    def __post_init__(self):
        if not 0 <= self.start < self.end:
            raise ValueError(f"an image takes tokens start..end-1 with 0 <= start < end, got {self.start}..{self.end}")


def key_ids(digest: bytes, length: int) -> list[int]:
    """The key ids of an image's ``length`` tokens."""
    d = int.from_bytes(digest, "little")
    chunks = [KEY_BASE | ((d >> (_CHUNK_BITS * i)) & _MASK) for i in range(_CHUNKS)]
    return [chunks[j % _CHUNKS] for j in range(length)]


def key_tokens(tokens: Sequence[int], images: Iterable[ImageKey]) -> tuple[int, ...]:
    """``tokens`` (a prompt's first tokens, or all of them and more) with its images' runs as key ids."""
    out = None
    n = len(tokens)
    for im in images:
        if im.start >= n:
            break  # images are in prompt order
        if out is None:
            out = list(tokens)
        end = min(im.end, n)
        out[im.start:end] = key_ids(im.digest, im.end - im.start)[:end - im.start]
    return tuple(tokens) if out is None else tuple(out)


def walk_back(cut: int, images: Iterable[ImageKey]) -> int:
    """``cut`` moved to the start of the image it falls inside (unchanged when it is at none's inside)."""
    for im in images:
        if im.start < cut < im.end:
            return im.start
    return cut


def walk_back_all(cuts: Iterable[int], images: Sequence[ImageKey]) -> tuple[int, ...]:
    """Cut points with each one inside an image moved before it; sorted, a cut at 0 dropped."""
    return tuple(sorted({c for c in (walk_back(c, images) for c in cuts) if c > 0}))
