"""engine.encoder_cache: LRU order, the byte budget, hits and misses."""

import pytest
import torch

from ignis.engine.encoder_cache import EncoderCache


def _emb(rows: int) -> torch.Tensor:
    return torch.zeros(rows, 4)  # 16 bytes a row


def test_least_recent_goes_first_within_the_budget():
    c = EncoderCache(max_bytes=3 * 64)
    for key in (b"a", b"b", b"c"):
        c.put(key, _emb(4))
    assert c.bytes == 192 and len(c) == 3
    assert c.get(b"a") is not None  # a is now the most recent
    c.put(b"d", _emb(4))
    assert b"b" not in c and all(k in c for k in (b"a", b"c", b"d"))
    assert c.get(b"b") is None
    assert (c.hits, c.misses) == (1, 1) and c.hit_ratio == 0.5


def test_replacing_and_oversized_entries():
    c = EncoderCache(max_bytes=100)
    c.put(b"a", _emb(2))
    c.put(b"a", _emb(4))
    assert c.bytes == 64 and len(c) == 1
    c.put(b"big", _emb(10))  # larger than the whole budget: not kept, nothing else dropped
    assert b"big" not in c and b"a" in c
    c.put(b"b", _emb(3))  # 64 + 48 > 100: a goes
    assert list(c._entries) == [b"b"] and c.bytes == 48
    c.clear()
    assert c.bytes == 0 and len(c) == 0
    assert EncoderCache(0).hit_ratio == 0.0
    with pytest.raises(ValueError):
        EncoderCache(-1)
