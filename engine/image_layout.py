"""Where a request's images sit in its prompt, and the mRoPE positions that follow from it.

Pure Python, no torch. Each image takes one run of ``<|image_pad|>`` tokens
(between ``<|vision_start|>`` and ``<|vision_end|>``), ``gh * gw`` of them for
an image whose merged grid is ``gh x gw`` (patch grid / merge size). Text
positions are the same on the three rotary sections (t, h, w); an image's
tokens are laid out on its grid, all from the position the image starts at,
and the text after it resumes ``max(gh, gw)`` past that start:

    tokens    : t0 t1 [i i i i i i] t8 ...        image 2 x 3 at index 2
    t section : 0  1   2 2 2 2 2 2  5             base = 2 (its start + delta)
    h section : 0  1   2 2 2 3 3 3  5             base + row
    w section : 0  1   2 3 4 2 3 4  5             base + column
    text after: index 8 -> 2 + max(2, 3) = 5, so delta = 5 - 8 = -3

A token's positions are a function of its index and the layout alone (the
delta at index ``p`` sums ``max(gh, gw) - gh * gw`` over the images that end
at or before ``p``), so any chunk boundary, a resume after preemption or from
a retained entry, and every decode step (``index + delta``) get them without
any running state. This is transformers' ``get_rope_index`` for Qwen3.5.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class ImageSpan:
    """One image's run of pad tokens: ``start`` .. ``start + grid_h * grid_w - 1`` (merged grid)."""

    start: int
    grid_h: int
    grid_w: int

    @property
    def length(self) -> int:
        return self.grid_h * self.grid_w

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def shift(self) -> int:
        """How far the positions after the image move against the token index."""
        return max(self.grid_h, self.grid_w) - self.length


@dataclass(frozen=True)
class ImageLayout:
    """The images of one prompt (in prompt order) and where each sits."""

    images: tuple  # tuple[ImageInput, ...], in prompt order
    spans: tuple[ImageSpan, ...]
    cache_keys: tuple[bytes, ...] = ()
    """What the embedding cache keys each image by: its digest, salted with the request's reuse scope
    when it has one (so one tenant's pictures are never another's cache hits; empty: the digests)."""

    def __post_init__(self):
        deltas, d = [], 0
        for s in self.spans:
            d += s.shift
            deltas.append(d)
        object.__setattr__(self, "_ends", [s.end for s in self.spans])
        object.__setattr__(self, "_deltas", deltas)

    @property
    def delta(self) -> int:
        """Position minus index after every image (decode steps and trailing text)."""
        return self._deltas[-1] if self._deltas else 0

    def delta_at(self, index: int) -> int:
        """Position minus index of a text token at ``index`` (every image ending at or before it counted)."""
        k = bisect_right(self._ends, index)
        return self._deltas[k - 1] if k else 0

    def cache_key(self, i: int) -> bytes:
        return self.cache_keys[i] if self.cache_keys else self.images[i].digest

    def overlapping(self, start: int, end: int) -> list[tuple[int, ImageSpan]]:
        """(image number, span) of the images with a token in ``start .. end - 1``."""
        return [(i, s) for i, s in enumerate(self.spans) if s.start < end and s.end > start]

    def positions(self, start: int, end: int) -> tuple[list[int], list[int], list[int]] | None:
        """The (t, h, w) positions of tokens ``start .. end - 1``; None when no image token is among
        them (then every section is ``index + delta_at(start)``)."""
        if not self.overlapping(start, end):
            return None
        t, h, w = [], [], []
        for p in range(start, end):
            k = bisect_right(self._ends, p)
            if k < len(self.spans) and self.spans[k].start <= p:
                s = self.spans[k]
                base = s.start + (self._deltas[k - 1] if k else 0)
                row, col = divmod(p - s.start, s.grid_w)
                t.append(base)
                h.append(base + row)
                w.append(base + col)
            else:
                pos = p + (self._deltas[k - 1] if k else 0)
                t.append(pos)
                h.append(pos)
                w.append(pos)
        return t, h, w


def image_layout(prompt_ids, images, image_token_id: int, factor: int) -> ImageLayout:
    """Match the prompt's runs of ``image_token_id`` to ``images`` (resized pictures, prompt order).

    ``factor`` is patch size x merge size: an image of ``H x W`` pixels takes
    ``(H / factor) x (W / factor)`` tokens. Raises ValueError when the runs
    and the images do not match one to one.
    """
    runs = []
    i, n = 0, len(prompt_ids)
    while i < n:
        if prompt_ids[i] == image_token_id:
            j = i
            while j < n and prompt_ids[j] == image_token_id:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    if len(runs) != len(images):
        raise ValueError(f"the prompt has {len(runs)} image placeholder runs for {len(images)} images")
    spans = []
    for k, ((start, length), image) in enumerate(zip(runs, images)):
        if image.height % factor or image.width % factor:
            raise ValueError(f"image {k} of {image.height}x{image.width} is not resized to a multiple of {factor}")
        span = ImageSpan(start, image.height // factor, image.width // factor)
        if span.length != length:
            raise ValueError(f"image {k} takes {span.length} placeholder tokens, the prompt has {length}")
        spans.append(span)
    return ImageLayout(tuple(images), tuple(spans))
