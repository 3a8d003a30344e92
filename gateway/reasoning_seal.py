"""Reasoning blobs (``encrypted_content`` of Responses reasoning items): sealed and opened with an install key.

A blob carries a turn's reasoning text to the client and back (``store: false``
with ``include: ["reasoning.encrypted_content"]``). Only the install that
sealed it can read it or make one it accepts:

    blob = "ig1." + base64url( nonce[16] | ciphertext | tag[32] )
    ciphertext = text (UTF-8) XOR keystream,  block i = BLAKE2b-512(key=enc_key, nonce | i as 8 bytes)
    tag = BLAKE2b-256(key=mac_key, "ig1" | nonce | ciphertext)           (encrypt, then authenticate)
    enc_key, mac_key = BLAKE2b(key=install_key, person="ignis-rs-enc" / "ignis-rs-mac")

The install key is 32 random bytes in a mode-0600 file, created at first use
(``RUNTIME_DIR/INSTANCE-reasoning.key``), so blobs outlive a gateway restart
(not a wipe of the runtime dir). A key file that cannot be used (readable by
others, wrong size) is logged and replaced, for this process only, by a random
key: its blobs then die with the process. ``ReasoningSeal.open`` raises ``SealError``
for anything it did not seal (tampered, truncated, another install's).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
from pathlib import Path

from ignis.shared.secret_file import load_secret

log = logging.getLogger("ignis.gateway")

PREFIX = "ig1."
KEY_BYTES = 32
NONCE_BYTES = 16
TAG_BYTES = 32
_BLOCK = 64


class SealError(ValueError):
    """A blob this install did not seal, or one changed since."""


def load_key(path: Path) -> bytes:
    """The install key at ``path``, created (mode 0600, random) when absent; OSError / ValueError when the
    file cannot be used."""
    return load_secret(path, KEY_BYTES, "reasoning key")


class ReasoningSeal:
    """Seals and opens reasoning blobs under one install key (loaded from ``path`` at first use)."""

    def __init__(self, path: Path | None = None, key: bytes | None = None):
        self._path = path
        self._keys: tuple[bytes, bytes] | None = None if key is None else self._derive(key)

    @staticmethod
    def _derive(key: bytes) -> tuple[bytes, bytes]:
        return (hashlib.blake2b(key=key, person=b"ignis-rs-enc", digest_size=32).digest(),
                hashlib.blake2b(key=key, person=b"ignis-rs-mac", digest_size=32).digest())

    def _key_pair(self) -> tuple[bytes, bytes]:
        if self._keys is None:
            try:
                if self._path is None:
                    raise ValueError("no key file configured")
                key = load_key(self._path)
            except (OSError, ValueError) as e:
                log.warning("reasoning blobs use a key of this process only (they will not outlive it): %s", e)
                key = os.urandom(KEY_BYTES)
            self._keys = self._derive(key)
        return self._keys

    @staticmethod
    def _xor(enc_key: bytes, nonce: bytes, data: bytes) -> bytes:
        blocks = (len(data) + _BLOCK - 1) // _BLOCK
        stream = b"".join(hashlib.blake2b(nonce + i.to_bytes(8, "little"), key=enc_key).digest()
                          for i in range(blocks))[:len(data)]
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(len(data), "little")

    @staticmethod
    def _tag(mac_key: bytes, nonce: bytes, ciphertext: bytes) -> bytes:
        return hashlib.blake2b(PREFIX[:-1].encode() + nonce + ciphertext, key=mac_key, digest_size=TAG_BYTES).digest()

    def seal(self, text: str) -> str:
        enc_key, mac_key = self._key_pair()
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = self._xor(enc_key, nonce, text.encode("utf-8"))
        raw = nonce + ciphertext + self._tag(mac_key, nonce, ciphertext)
        return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")

    def open(self, blob: str) -> str:
        """The text sealed in ``blob``; ``SealError`` when this install did not seal it as it stands."""
        if not isinstance(blob, str) or not blob.startswith(PREFIX):
            raise SealError("is not a reasoning blob of this server")
        try:
            raw = base64.urlsafe_b64decode(blob[len(PREFIX):].encode("ascii"))
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise SealError("is not a reasoning blob of this server (bad encoding)") from None
        if len(raw) < NONCE_BYTES + TAG_BYTES:
            raise SealError("is truncated")
        enc_key, mac_key = self._key_pair()
        nonce, ciphertext, tag = raw[:NONCE_BYTES], raw[NONCE_BYTES:-TAG_BYTES], raw[-TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(mac_key, nonce, ciphertext)):
            raise SealError("failed authentication: it was changed, or sealed by another server or key")
        try:
            return self._xor(enc_key, nonce, ciphertext).decode("utf-8")
        except UnicodeDecodeError:
            raise SealError("failed authentication") from None
