"""Recent image embeddings, by image digest: a byte-bounded LRU.

A repeated image (the same resized picture, ``ImageInput.digest``) is not
encoded again while its embedding is here, whether or not its request resumed
from a retained entry. The newest entry always fits: one larger than the
whole budget is not kept. Pure Python: an entry is anything with ``numel()``
and ``element_size()`` (a tensor); no torch import.
"""

from __future__ import annotations

from collections import OrderedDict


class EncoderCache:
    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"encoder cache budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries

    @staticmethod
    def size_of(value) -> int:
        return value.numel() * value.element_size()

    def get(self, digest: bytes):
        """The embedding of ``digest`` (now the most recent), or None; counts a hit or a miss."""
        value = self._entries.get(digest)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(digest)
        self.hits += 1
        return value

    def put(self, digest: bytes, value) -> None:
        """Keep ``value`` as the most recent entry, dropping the least recent ones past the budget."""
        size = self.size_of(value)
        old = self._entries.pop(digest, None)
        if old is not None:
            self.bytes -= self.size_of(old)
        if size > self.max_bytes:
            return
        while self._entries and self.bytes + size > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= self.size_of(dropped)
        self._entries[digest] = value
        self.bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    @property
    def hit_ratio(self) -> float:
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0
