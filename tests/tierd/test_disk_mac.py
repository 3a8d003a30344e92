"""The KV-disk chunk MAC: one-time Poly1305 keys bound to the install key, the nonce, the header and the index."""

from __future__ import annotations

import numpy as np
import pytest

from ignis.tierd import disk_mac

KEY = bytes(range(32))
NONCE = bytes(range(100, 116))
HEADER = b'{"key":"k","stamp":"s"}'


def test_a_tag_depends_on_every_input_of_its_key_and_on_every_byte():
    data = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8)
    k = disk_mac.chunk_key(KEY, NONCE, HEADER, 3)
    tag = disk_mac.chunk_tag(k, data)
    assert len(k) == 32 and len(tag) == disk_mac.TAG_BYTES
    assert disk_mac.tag_matches(k, data, tag) and disk_mac.tag_matches(k, data.tobytes(), tag)
    others = [disk_mac.chunk_key(bytes(32), NONCE, HEADER, 3), disk_mac.chunk_key(KEY, bytes(16), HEADER, 3),
              disk_mac.chunk_key(KEY, NONCE, HEADER + b" ", 3), disk_mac.chunk_key(KEY, NONCE, HEADER, 4)]
    assert len({k, *others}) == 5
    assert not any(disk_mac.tag_matches(o, data, tag) for o in others)
    flipped = data.copy()
    flipped[12345] ^= 0x80
    assert not disk_mac.tag_matches(k, flipped, tag)
    assert not disk_mac.tag_matches(k, data[:-1], tag)  # a shorter chunk
    assert not disk_mac.tag_matches(k, np.concatenate([data, np.zeros(16, np.uint8)]), tag)  # zero padded


def test_nonces_are_fresh_and_bad_sizes_are_refused():
    assert len({disk_mac.new_nonce() for _ in range(64)}) == 64
    with pytest.raises(ValueError, match="MAC key is 32 bytes"):
        disk_mac.chunk_key(b"short", NONCE, HEADER, 0)
    with pytest.raises(ValueError, match="nonce is 16 bytes"):
        disk_mac.chunk_key(KEY, b"short", HEADER, 0)
