"""KV-disk: one file per entry in a directory tierd owns, under a byte ceiling.

Directory (mode 0700)::

    <kv-disk-dir>/
        .ignis-kv-disk          marker: this directory belongs to a tierd
        <key>.kv                one complete entry
        <key>.kv.part           an entry being written (renamed to .kv when complete)

``prepare_dir`` wipes it at start and ``wipe_dir`` at exit: KV-disk never
outlives the process. Only the marker and files with those suffixes are ever
removed; a directory holding anything else, or files without the marker, is
refused (``ForeignFilesError``) and left as it is.

File layout (little endian)::

    | "IGNISKV1" (8) | header_len u32 (4) | chunk_bytes u32 (4) | header JSON | payload | digest 0 | ... | digest k-1 |

The header JSON holds key, stamp, payload bytes and the block of every ref.
The payload is checked in chunks of ``chunk_bytes`` (16 MiB by default):
digest i is keyed blake2b-256 (a MAC) over (header JSON, i as u64, payload
chunk i), so a chunk cannot be swapped between files or positions, and a
file this install did not write fails the check even when whoever wrote it
computed plain checksums. The MAC key is a per-install secret
(``load_mac_key``: 32 random bytes in a mode-0600 file, created at first
start). ``read_entry`` checks
the size and the header, then verifies each chunk before handing it on; a
bad file raises ``CorruptFile`` naming what is wrong. An entry of at most one
chunk is therefore never handed on at all when its file is bad; in a longer
one, the chunks before the bad one have been.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

MARKER = ".ignis-kv-disk"
SUFFIX = ".kv"
PART = ".kv.part"
MAGIC = b"IGNISKV1"
_PREFIX = struct.Struct("<8sII")
DIGEST_BYTES = 32
CHUNK_BYTES = 16 << 20
RETRY_AFTER_S = 30.0
"""After a failed write (disk full, I/O error) KV-disk takes no writes for this long, then tries again."""

FAULT_DISK_WRITE_ENV = "IGNIS_TIERD_FAULT_DISK_WRITE_S"
"""Fault injection for tests: every KV-disk write waits this many seconds before its first byte (a slow
disk). The wait is on the disk thread, before anything is read from engine memory or the arena."""


def fault_disk_write_s() -> float:
    try:
        return max(0.0, float(os.environ.get(FAULT_DISK_WRITE_ENV, "0") or 0))
    except ValueError:
        return 0.0


class ForeignFilesError(RuntimeError):
    """The KV-disk directory holds files tierd did not create; it is not wiped."""


class CorruptFile(ValueError):
    """A KV-disk file is truncated, altered or not the entry asked for; the message says which.

    ``check`` names the check it failed: ``gone``, ``size``, ``header``,
    ``short_read`` or ``checksum``."""

    def __init__(self, message: str, check: str):
        super().__init__(message)
        self.check = check


def _ours(name: str) -> bool:
    return name == MARKER or name.endswith(SUFFIX) or name.endswith(PART)


def prepare_dir(path: str | os.PathLike) -> Path:
    """Create or wipe the KV-disk directory and leave only the marker in it."""
    path = Path(os.path.abspath(path))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ForeignFilesError(f"cannot create the KV-disk directory {path}: {e}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ForeignFilesError(f"KV-disk path {path} is not a plain directory; refusing to use it")
    names = os.listdir(path)
    foreign = sorted(n for n in names if not _ours(n) or not (path / n).is_file() or (path / n).is_symlink())
    if foreign:
        raise ForeignFilesError(
            f"KV-disk directory {path} holds files tierd did not create ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); refusing to wipe it. Point --kv-disk-dir at an empty "
            f"or tierd-owned directory")
    if names and MARKER not in names:
        raise ForeignFilesError(
            f"KV-disk directory {path} holds {len(names)} file(s) but no {MARKER} marker, so they are not "
            f"this tierd's; refusing to wipe it. Point --kv-disk-dir at an empty or tierd-owned directory")
    wipe_dir(path, remove=False)
    os.chmod(path, 0o700)
    (path / MARKER).write_text("KV-disk of an ignis tierd; wiped at its start and exit\n")
    return path


def wipe_dir(path: str | os.PathLike, remove: bool = True) -> None:
    """Remove tierd's files (and with ``remove`` the marker and the directory, if then empty)."""
    path = Path(path)
    if not path.is_dir():
        return
    for name in os.listdir(path):
        if name != MARKER and _ours(name) and (path / name).is_file():
            (path / name).unlink(missing_ok=True)
    if remove:
        (path / MARKER).unlink(missing_ok=True)
        try:
            path.rmdir()
        except OSError:
            pass  # someone put a file there meanwhile; it stays, and so does the directory


def encode_header(key: str, stamp: str, nbytes: int, shape: tuple[str, ...]) -> bytes:
    import orjson  # noqa: PLC0415 - here, so the copy path imports without it (bench/gpu_tiers.py)

    return orjson.dumps({"key": key, "stamp": stamp, "payload_bytes": nbytes, "shape": list(shape)})


def chunk_count(nbytes: int, chunk: int = CHUNK_BYTES) -> int:
    return max(1, -(-nbytes // chunk))


def file_bytes(header: bytes, nbytes: int, chunk: int = CHUNK_BYTES) -> int:
    """Bytes a file of this header and payload takes."""
    return _PREFIX.size + len(header) + nbytes + DIGEST_BYTES * chunk_count(nbytes, chunk)


MAC_KEY_BYTES = 32


class MacKeyError(RuntimeError):
    """The MAC key file cannot be used (readable by others, wrong size, not a file)."""


def load_mac_key(path: str | os.PathLike) -> bytes:
    """The install's KV-disk MAC key at ``path``, created (mode 0600, random) when absent; a file
    readable or writable by anyone but its owner, or of the wrong size, is refused."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(MAC_KEY_BYTES))
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise MacKeyError(f"KV-disk MAC key {path} is not a regular file")
    if st.st_mode & 0o077:
        raise MacKeyError(f"KV-disk MAC key {path} has mode {stat.S_IMODE(st.st_mode):o}; "
                          f"it must be 0600 or stricter (chmod 600 {path})")
    key = path.read_bytes()
    if len(key) != MAC_KEY_BYTES:
        raise MacKeyError(f"KV-disk MAC key {path} holds {len(key)} bytes, not {MAC_KEY_BYTES}")
    return key


def _digest(header: bytes, index: int, mac_key: bytes):
    if len(mac_key) != MAC_KEY_BYTES:
        raise ValueError(f"a KV-disk MAC key is {MAC_KEY_BYTES} bytes")
    d = hashlib.blake2b(header, digest_size=DIGEST_BYTES, key=mac_key)
    d.update(index.to_bytes(8, "little"))
    return d


def write_entry(path: Path, header: bytes, pieces: Iterable[memoryview | np.ndarray], nbytes: int, mac_key: bytes,
                chunk: int = CHUNK_BYTES) -> int:
    """Write ``pieces`` (``nbytes`` of payload, in order, any sizes) to ``<path>.part``, then rename it
    to ``path``; returns the file's bytes. A partial file is removed on any error."""
    delay = fault_disk_write_s()
    if delay:
        time.sleep(delay)
    part = path.with_name(path.name + ".part")
    digests: list[bytes] = []
    d, in_chunk, size = _digest(header, 0, mac_key), 0, 0
    try:
        with open(part, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(header), chunk))
            f.write(header)
            for piece in pieces:
                view = memoryview(piece).cast("B")
                f.write(view)
                size += view.nbytes
                while view.nbytes:  # feed the digests, cutting at chunk boundaries
                    take = min(view.nbytes, chunk - in_chunk)
                    d.update(view[:take])
                    view, in_chunk = view[take:], in_chunk + take
                    if in_chunk == chunk:
                        digests.append(d.digest())
                        d, in_chunk = _digest(header, len(digests), mac_key), 0
            if size != nbytes:
                raise ValueError(f"wrote {size} payload bytes for an entry of {nbytes}")
            if in_chunk or not digests:
                digests.append(d.digest())
            f.write(b"".join(digests))
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return file_bytes(header, nbytes, chunk)


def read_entry(path: Path, header: bytes, nbytes: int, staging: np.ndarray,
               consume: Callable[[int, np.ndarray], None], mac_key: bytes, chunk: int = CHUNK_BYTES) -> None:
    """Read and verify ``path`` chunk by chunk; ``consume(payload_offset, chunk_view)`` gets each good chunk.

    ``staging`` (uint8, at least ``min(chunk, nbytes)`` bytes) is reused for
    every chunk. Raises ``CorruptFile`` when the file is gone, truncated, for
    another entry or stamp, or a chunk fails its checksum.
    """
    expect = file_bytes(header, nbytes, chunk)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CorruptFile(f"KV-disk file {path.name} is gone", "gone") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != expect:
            raise CorruptFile(f"KV-disk file {path.name} is {size} bytes, expected {expect} (truncated or extended)", "size")
        magic, hlen, file_chunk = _PREFIX.unpack(f.read(_PREFIX.size))
        if magic != MAGIC or file_chunk != chunk:
            raise CorruptFile(f"KV-disk file {path.name} does not start with {MAGIC!r} and chunk size {chunk}", "header")
        if hlen != len(header) or f.read(hlen) != header:
            raise CorruptFile(f"KV-disk file {path.name} has another header (key, stamp or layout differ)", "header")
        payload_at = f.tell()
        f.seek(payload_at + nbytes)
        digests = f.read(DIGEST_BYTES * chunk_count(nbytes, chunk))
        f.seek(payload_at)
        for i in range(chunk_count(nbytes, chunk)):
            n = min(chunk, nbytes - i * chunk)
            view = staging[:n]
            if f.readinto(memoryview(view)) != n:
                raise CorruptFile(f"KV-disk file {path.name}: short read in chunk {i}", "short_read")
            d = _digest(header, i, mac_key)
            d.update(memoryview(view))
            if d.digest() != digests[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES]:
                raise CorruptFile(f"KV-disk file {path.name} fails the keyed blake2b checksum (MAC) of chunk {i} (corrupt, or not written by this install)", "checksum")
            consume(i * chunk, view)


class DiskTier:
    """The directory and its byte ceiling; ``used`` counts reserved and written files."""

    def __init__(self, path: Path, ceiling: int, mac_key: bytes, chunk: int = CHUNK_BYTES,
                 retry_after_s: float = RETRY_AFTER_S, clock: Callable[[], float] = time.monotonic):
        if ceiling <= 0:
            raise ValueError("a DiskTier needs a positive byte ceiling (0 means KV-disk off)")
        if len(mac_key) != MAC_KEY_BYTES:
            raise ValueError(f"a KV-disk MAC key is {MAC_KEY_BYTES} bytes")
        self.path = Path(path)
        self.mac_key = mac_key
        self.ceiling = ceiling
        self.chunk = chunk
        self.used = 0
        self.retry_after_s = retry_after_s
        self.failures = 0
        self._clock = clock
        self._off_until = 0.0

    @property
    def healthy(self) -> bool:
        """False for ``retry_after_s`` after a write error (disk full, I/O error): no writes meanwhile."""
        return self._clock() >= self._off_until

    def failed(self) -> None:
        """A write failed: take no writes for ``retry_after_s``, then try again."""
        self.failures += 1
        self._off_until = self._clock() + self.retry_after_s

    @property
    def free(self) -> int:
        return max(0, self.ceiling - self.used)

    def file_path(self, key: str) -> Path:
        return self.path / f"{key}{SUFFIX}"

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.free:
            raise MemoryError(f"{nbytes} KV-disk bytes asked for, {self.free} free")
        self.used += nbytes

    def release(self, nbytes: int) -> None:
        if nbytes > self.used:
            raise ValueError(f"releasing {nbytes} KV-disk bytes, only {self.used} in use")
        self.used -= nbytes

    def remove(self, key: str) -> None:
        self.file_path(key).unlink(missing_ok=True)
        self.file_path(key).with_name(f"{key}{PART}").unlink(missing_ok=True)

    def files(self) -> list[str]:
        """Names of the entry files in the directory now (none if the directory is gone)."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(SUFFIX) or n.endswith(PART))
