"""Stored responses (``store: true``) for ``previous_response_id``: bounded in memory, each for a TTL.

An entry is what continuing a conversation needs: the chat messages of the
whole conversation so far (the earlier turns, this request's input, and this
response's assistant turn, reasoning included in plain text; never the
request's ``instructions``, which OpenAI does not carry over) and the
response object for ``GET /v1/responses/{id}``, and the input items that
``GET /v1/responses/{id}/input_items`` lists (the conversation's items up to
this response's input, each with its id: gateway.responses_items.listed_items).

Bounds: at most ``max_entries`` entries and ``max_chars`` characters in all,
counting an entry's message text, its listed items and its response object
as JSON (which echoes the request's ``instructions``, ``tools`` and
``metadata``: none of them is in the messages); the oldest go first. An entry older than ``ttl_s`` is
gone (``get`` answers None, as for an id never stored). Nothing survives a
restart. Pure Python, one event loop: no locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import orjson

DEFAULT_ENTRIES = 1024
DEFAULT_CHARS = 64 << 20
DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    messages: tuple[dict, ...]
    response: dict
    chars: int
    stored_at: float
    items: tuple[dict, ...] = ()


def _chars(messages) -> int:
    total = 0
    for m in messages:
        for v in m.values():
            total += len(v) if isinstance(v, str) else len(repr(v))
    return total


class ResponseStore:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES, max_chars: int = DEFAULT_CHARS,
                 ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.max_entries, self.max_chars, self.ttl_s = max_entries, max_chars, ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, rid: str, messages: list[dict], response: dict, items: list[dict] = ()) -> None:
        """``items``: the input items listed for this response (counted in ``max_chars`` too, as is the
        response object: its JSON's bytes, at least its characters)."""
        chars = _chars(messages) + _chars(items) + len(orjson.dumps(response))
        if chars > self.max_chars:
            return  # larger than the whole store: never kept
        self._drop(rid)
        self._entries[rid] = StoredResponse(tuple(messages), response, chars, self._clock(), tuple(items))
        self._chars += chars
        while len(self._entries) > self.max_entries or self._chars > self.max_chars:
            self._drop(next(iter(self._entries)))

    def get(self, rid: str) -> StoredResponse | None:
        entry = self._entries.get(rid)
        if entry is not None and self._clock() - entry.stored_at > self.ttl_s:
            self._expire()
            return None
        return entry

    def delete(self, rid: str) -> bool:
        return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self._chars -= entry.chars
        return entry is not None

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            rid, entry = next(iter(self._entries.items()))
            if now - entry.stored_at <= self.ttl_s:
                break
            self._drop(rid)
