"""Image embeddings for the prefill chunks of a round: encoded once, cached by digest.

Owns the vision tower's use at run time. A request's image is encoded when
the first chunk touching it runs, and its embedding stays pinned to the
request until the chunk that reaches the image's last token has run, so a
prefill split inside an image encodes it once whatever the cache does. Every
embedding also goes into the :class:`EncoderCache` (LRU, byte-bounded, keyed
by ``ImageLayout.cache_key``: the picture's digest, salted with the request's
``cache_salt`` or adapter when it has one), so the same picture in a later
request or turn of the same scope is not encoded again, and a salted tenant
cannot learn from a fast answer that another sent a picture. The images a
round needs are encoded in one tower call.
"""

from __future__ import annotations

import torch

from ignis.engine.encoder_cache import EncoderCache
from ignis.engine.image_layout import ImageLayout
from ignis.engine.models.image_patches import patchify
from ignis.engine.models.vision import VisionTower


class ImageEncoder:
    def __init__(self, tower: VisionTower, cache_bytes: int):
        self.tower = tower
        self.cache = EncoderCache(cache_bytes)
        self.encoded = 0  # images run through the tower
        self._pinned: dict[tuple[str, int], torch.Tensor] = {}  # (req_id, image number) -> [tokens, hidden]

    def prepare(self, wanted: list[tuple[str, ImageLayout, int]]) -> None:
        """Make sure each (req_id, layout, image number) has its embedding pinned; encode what is missing
        (each distinct picture once) in one tower call."""
        todo: dict[bytes, object] = {}
        for req_id, layout, i in wanted:
            key = (req_id, i)
            if key in self._pinned:
                continue
            digest = layout.cache_key(i)
            emb = self.cache.get(digest)
            if emb is not None:
                self._pinned[key] = emb
            else:
                todo.setdefault(digest, layout.images[i])
        if todo:
            items = [patchify(image, self.tower.cfg) for image in todo.values()]
            outs = self.tower([p for p, _ in items], [g for _, g in items])
            self.encoded += len(outs)
            fresh = dict(zip(todo, outs))
            for digest, emb in fresh.items():
                self.cache.put(digest, emb)
            for req_id, layout, i in wanted:
                self._pinned.setdefault((req_id, i), fresh.get(layout.cache_key(i)))

    def embedding(self, req_id: str, i: int) -> torch.Tensor:
        """The pinned embedding [tokens, hidden] of ``req_id``'s image ``i`` (``prepare`` first)."""
        return self._pinned[(req_id, i)]

    def done(self, req_id: str, i: int) -> None:
        """The image's last token has run: unpin it (the cache may still hold it)."""
        self._pinned.pop((req_id, i), None)

    def release(self, req_id: str) -> None:
        """Unpin every image of a request that ended."""
        for key in [k for k in self._pinned if k[0] == req_id]:
            del self._pinned[key]
