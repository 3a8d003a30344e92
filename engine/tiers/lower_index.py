"""Retained entries held below the device (KV-RAM, KV-disk), as the engine knows them.

Pure Python. Each record keeps the entry's tokens, so a lookup is the same
content match as on the device: the longest record whose tokens are a
prefix of the prompt, verified token by token. Whether to take it is the
restore floor's call: a match in a lower tier is worth a restore only if it
reuses at least that tier's floor more tokens than the best match above it;
ties go to the tier above.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

TIERS = ("ram", "disk")
WIRE_TIER = {"ram": "kv_ram", "disk": "kv_disk"}


def content_key(tokens: tuple[int, ...]) -> str:
    """The tierd key of an entry: a hash of its whole token sequence (hex)."""
    return hashlib.blake2b(array("i", tokens).tobytes(), digest_size=16).hexdigest()


@dataclass
class LowerRecord:
    key: str
    tokens: tuple[int, ...]
    kind: str
    request_class: str
    after_user: bool
    tier: str  # "ram" | "disk"

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


class LowerIndex:
    def __init__(self, floors: dict[str, int]):
        for tier in TIERS:
            if floors.get(tier, 0) < 0:
                raise ValueError(f"restore floor of {tier} must be >= 0")
        self.floors = {t: int(floors.get(t, 0)) for t in TIERS}
        self._records: dict[str, LowerRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: LowerRecord) -> None:
        self._records[record.key] = record

    def forget(self, key: str) -> None:
        self._records.pop(key, None)

    def clear(self) -> None:
        self._records.clear()

    def move(self, key: str, tier: str) -> None:
        if key in self._records:
            self._records[key].tier = tier

    def best(self, tokens: tuple[int, ...], limit: int) -> LowerRecord | None:
        """Longest record that is a prefix of ``tokens`` and at most ``limit`` long (ties: RAM first)."""
        best = None
        for r in self._records.values():
            n = r.num_tokens
            if n > limit or tuple(tokens[:n]) != r.tokens:
                continue
            if best is None or n > best.num_tokens or (n == best.num_tokens and r.tier == "ram"):
                best = r
        return best

    def worth_restoring(self, record: LowerRecord, device_match: int) -> bool:
        """The restore floor: at least ``floor`` more tokens than the best match above."""
        return record.num_tokens >= device_match + max(1, self.floors[record.tier])
