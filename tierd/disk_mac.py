"""The MAC of KV-disk chunks: Poly1305 under a one-time key per chunk of each file, derived from the install's key.

For payload chunk ``i`` of a file with header JSON ``header`` and nonce ``nonce``::

    k_i   = HMAC-SHA256(install key, "ignis-kv-disk-3" | nonce | i as u64 | header)    32 bytes
    tag_i = Poly1305(k_i, chunk i)                                                      16 bytes

Poly1305 is a one-time authenticator: as long as each key tags a single
message, a forged tag passes with probability about ``8 * len / 2**106``
(far below 2**-80 for a 16 MiB chunk). The nonce is 16 random bytes drawn
afresh for every file written, so no ``k_i`` ever tags two messages (a file
written again for the same key and stamp gets another nonce); the header and
the index in ``k_i`` bind a chunk to its entry, its stamp and its position,
so a chunk cannot be swapped between files or positions. Without the install
key nobody can compute a ``k_i``: a file anyone else wrote, even with correct
plain checksums, fails the check.

HMAC-SHA256 runs once per chunk over a few hundred bytes; the per-byte work
is Poly1305, which OpenSSL (through ``cryptography``) runs at 6-10 GB/s a
core on x86-64 and ARMv8, against 1-2 GB/s for HMAC-SHA256 with SHA-NI: a
KV-disk copy is then bound by the disk, not by its MAC.
"""

from __future__ import annotations

import hmac
import os

KEY_BYTES = 32
"""The install's MAC key."""

NONCE_BYTES = 16
TAG_BYTES = 16
_CONTEXT = b"ignis-kv-disk-3"


def new_nonce() -> bytes:
    """A fresh nonce for one file."""
    return os.urandom(NONCE_BYTES)


def poly1305():
    """The Poly1305 class (``cryptography``); imported here so the copy path imports without it
    (bench/gpu_tiers.py on a bare GPU machine). A missing package raises ImportError."""
    from cryptography.hazmat.primitives.poly1305 import Poly1305  # noqa: PLC0415

    return Poly1305


def chunk_key(mac_key: bytes, nonce: bytes, header: bytes, index: int) -> bytes:
    """The one-time Poly1305 key of chunk ``index`` of the file with this nonce and header."""
    if len(mac_key) != KEY_BYTES:
        raise ValueError(f"a KV-disk MAC key is {KEY_BYTES} bytes")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a KV-disk nonce is {NONCE_BYTES} bytes")
    d = hmac.new(mac_key, _CONTEXT, "sha256")
    d.update(nonce)
    d.update(index.to_bytes(8, "little"))
    d.update(header)
    return d.digest()


UPDATE_BYTES = 1 << 20
"""Poly1305 holds the GIL while it hashes: it is fed this much at a time, so the other I/O threads and
the disk thread (whose syscalls and numpy copies run without the GIL) wait at most ~0.1 ms to take it back."""


def chunk_tag(key: bytes, data) -> bytes:
    """Poly1305 of ``data`` (any contiguous buffer) under ``key``, a ``chunk_key``."""
    mac = poly1305()(key)
    view = memoryview(data).cast("B")
    for at in range(0, view.nbytes, UPDATE_BYTES):
        mac.update(view[at:at + UPDATE_BYTES])
    return mac.finalize()


def tag_matches(key: bytes, data, want: bytes) -> bool:
    """Whether ``data``'s tag under ``key`` is ``want`` (compared in constant time)."""
    return hmac.compare_digest(chunk_tag(key, data), want)
