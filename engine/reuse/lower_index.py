"""Retained entries held below the device (KV-RAM, KV-disk), as the engine knows them.

Pure Python. Each record keeps the entry's tokens, so a lookup is the same
content match as on the device: the longest record whose tokens are a
prefix of the prompt, verified token by token. tierd moves entries from
KV-RAM to KV-disk and discards them on its own, so the engine refreshes the
records of a prompt's matches (``update``) before it picks one. Which to take
is the restore floors' call (``choose``): a match in a lower tier is worth a
restore only if it reuses at least that tier's floor more tokens than the
best match above it (for KV-disk: the better of the device's and KV-RAM's);
ties go to the tier above.

The index is bounded: tierd discards entries on its own (its arena or disk
full, a TTL) and the engine only hears of it when it asks about that key, so
records of entries nobody asks for again would pile up. At most ``limit``
records (``MAX_RECORDS``) holding at most ``token_limit`` tokens in all
(``MAX_RECORD_TOKENS``) are kept, the least recently added or used going
first; forgetting one loses nothing but the chance to restore that entry
(tierd still holds it until its own policy drops it). A record keeps its
tokens as int32 (4 bytes a token, where a tuple of ints takes ~36).

Every change to what the index holds is told to its ``blocks`` ledger
(``engine.reuse.block_events``; a no-op unless KV events are on): a record
added is stored in its tier's medium, forgotten or cleared is removed, moved
is both.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ignis.engine.reuse.block_events import NO_BLOCK_EVENTS, TIER_MEDIUM
from ignis.shared.tier_wire import TIERS

MAX_RECORDS = 4096
"""Records the engine keeps of entries in tierd. A 27B state image is ~147 MiB, so a 64 GiB arena holds
~440 entries; small models' entries are tiny, and past this many the oldest are forgotten here."""
MAX_RECORD_TOKENS = 32 << 20
"""Tokens all records keep together (128 MiB as int32): 4,096 agent prompts of 100K tokens would
otherwise hold 1.6 GB of the engine's memory; past this the oldest records are forgotten too."""
WIRE_TIER = {"ram": "kv_ram", "disk": "kv_disk"}


def content_key(tokens: tuple[int, ...]) -> str:
    """The tierd key of an entry: a hash of its whole token sequence (hex)."""
    return hashlib.blake2b(array("i", tokens).tobytes(), digest_size=16).hexdigest()


@dataclass
class LowerRecord:
    key: str
    tokens: Sequence[int]  # kept as array("i")
    kind: str
    request_class: str
    after_user: bool
    tier: str  # "ram" | "disk"

    def __post_init__(self):
        if not isinstance(self.tokens, array):
            self.tokens = array("i", self.tokens)

    def is_prefix_of(self, tokens: Sequence[int]) -> bool:
        """Whether the record's tokens are the first ``num_tokens`` of ``tokens``."""
        n = len(self.tokens)
        return len(tokens) >= n and array("i", tokens[:n]) == self.tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


class LowerIndex:
    def __init__(self, floors: dict[str, int], blocks=NO_BLOCK_EVENTS, limit: int = MAX_RECORDS,
                 token_limit: int = MAX_RECORD_TOKENS):
        for tier in TIERS:
            if floors.get(tier, 0) < 0:
                raise ValueError(f"restore floor of {tier} must be >= 0")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.floors = {t: int(floors.get(t, 0)) for t in TIERS}
        self._records: OrderedDict[str, LowerRecord] = OrderedDict()  # oldest first
        self.blocks = blocks
        self.limit = limit
        self.token_limit = token_limit
        self.tokens_held = 0  # tokens all records keep
        self.forgotten = 0  # records dropped here for the bound (tierd may still hold them)

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: LowerRecord) -> None:
        old = self._records.get(record.key)
        if old is not None:
            self.blocks.dropped(old.tokens, TIER_MEDIUM[old.tier])
            self.tokens_held -= old.num_tokens
        self._records[record.key] = record
        self._records.move_to_end(record.key)
        self.tokens_held += record.num_tokens
        self.blocks.held(record.tokens, TIER_MEDIUM[record.tier])
        while len(self._records) > self.limit or (self.tokens_held > self.token_limit and len(self._records) > 1):
            _, oldest = self._records.popitem(last=False)
            self.tokens_held -= oldest.num_tokens
            self.blocks.dropped(oldest.tokens, TIER_MEDIUM[oldest.tier])
            self.forgotten += 1

    def forget(self, key: str) -> None:
        record = self._records.pop(key, None)
        if record is not None:
            self.tokens_held -= record.num_tokens
            self.blocks.dropped(record.tokens, TIER_MEDIUM[record.tier])

    def clear(self) -> None:
        for record in self._records.values():
            self.blocks.dropped(record.tokens, TIER_MEDIUM[record.tier])
        self._records.clear()
        self.tokens_held = 0

    def move(self, key: str, tier: str) -> None:
        record = self._records.get(key)
        if record is None:
            return
        self._records.move_to_end(key)  # asked about or restored: recently used
        if record.tier != tier:
            self.blocks.moved(record.tokens, TIER_MEDIUM[record.tier], TIER_MEDIUM[tier])
            record.tier = tier

    def matches(self, tokens: tuple[int, ...], limit: int, longer_than: int = 0) -> list[LowerRecord]:
        """Records that are a prefix of ``tokens``, at most ``limit`` and more than ``longer_than`` long.

        The prompt becomes an int32 array once; a record is compared whole (in C) only when its last token
        is the prompt's at that position, which most records sharing only a system prompt fail at once:
        thousands of long records cost milliseconds, where a copy per record cost seconds."""
        if not self._records:
            return []
        prompt = array("i", tokens)
        out = []
        for r in self._records.values():
            rt = r.tokens
            n = len(rt)
            if longer_than < n <= limit and n <= len(prompt) and prompt[n - 1] == rt[n - 1] and prompt[:n] == rt:
                out.append(r)
        return out

    def update(self, where: dict[str, str | None]) -> None:
        """What tierd said of some keys: the tier each is in now, or None (gone: forgotten)."""
        for key, tier in where.items():
            if tier is None:
                self.forget(key)
            elif tier in TIERS:
                self.move(key, tier)

    def shortest_worth(self, device_match: int) -> int:
        """The fewest tokens a record must hold for ``choose`` to take it over ``device_match`` in either
        tier (the lower floor above the device's match): when no match is as long, tierd is not asked."""
        return device_match + min(max(1, self.floors[t]) for t in TIERS)

    def choose(self, records: list[LowerRecord], device_match: int) -> LowerRecord | None:
        """The record to restore, or None to stay with the device's ``device_match`` tokens.

        KV-RAM's best is taken if it reuses at least the RAM floor more than the
        device; KV-disk's best if it reuses at least the disk floor more than the
        better of the device and KV-RAM. Every floor is at least one token, so
        a tie always goes to the tier above."""
        best: dict[str, LowerRecord | None] = {t: None for t in TIERS}
        for r in records:
            if r.tier in best and (best[r.tier] is None or r.num_tokens > best[r.tier].num_tokens):
                best[r.tier] = r
        ram, disk = best["ram"], best["disk"]
        pick = None
        if ram is not None and ram.num_tokens >= device_match + max(1, self.floors["ram"]):
            pick = ram
        above = max(device_match, ram.num_tokens if ram is not None else 0)
        if disk is not None and disk.num_tokens >= above + max(1, self.floors["disk"]):
            pick = disk
        return pick
