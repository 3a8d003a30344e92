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

    | "IGNISKV3" (8) | header_len u32 (4) | chunk_bytes u32 (4) | header JSON | payload |
    | nonce (16) | tag 0 (16) | ... | tag k-1 (16) |

The header JSON holds key, stamp, payload bytes, the block of every ref and
the id of the tierd session that wrote the file (``DiskTier.session``, drawn
at random for each): file names come from content, so another tierd on the
same directory (a bind mount of it, say, with the same install key) writes
the same names, and a same-shaped model has the same stamp; its files, and an
earlier session's, fail the header check instead of restoring another
model's state.
The payload is checked in chunks of ``chunk_bytes`` (16 MiB by default):
tag i (16 bytes) is Poly1305 of payload chunk i under a one-time key derived
with HMAC-SHA256 from the install's key, the file's nonce (16 random bytes
drawn for every file written), i and the header JSON (``disk_mac``). A chunk
cannot be swapped between files or positions, and a file this install did not
write fails the check even when whoever wrote it computed plain checksums.
The MAC key is a per-install secret (``load_mac_key``: 32 random bytes in a
mode-0600 file, created at first start). Poly1305 runs at several GB/s a
core, so the MAC does not bound KV-disk's speed. Formats 1 (``IGNISKV1``,
keyed blake2b per chunk) and 2 (``IGNISKV2``, HMAC-SHA256 per chunk: 1-2
GB/s a core, the bound on KV-disk's speed) are refused with a message
naming them.

I/O (``disk_io``): a file is written and read in aligned windows of one
chunk, several in flight, each MACed on an I/O thread; with O_DIRECT where
the filesystem takes it. With ``at = 16 + header_len``, ``s = at % 4096``
and ``base = at - s``, window i is file bytes [base + i*chunk, base +
(i+1)*chunk): the last ``s`` bytes before chunk i (the header's tail, or
chunk i-1's), then chunk i but its last ``s`` bytes::

    file    | prefix | header ...|.. chunk 0 ....................|.. chunk 1 ......| ... | nonce, tags |
    windows [ head (base bytes) ][ s | chunk 0 less s bytes      ][ s | chunk 1 ... ] ... [ tail ]

A window's staging buffer holds s + chunk bytes, so chunk i is contiguous
for its MAC; the aligned front goes out at once, the rest is carried over
to the next window, and the last window's rest, the nonce and the tags are
written padded to 4096, then the file is cut to its size.

``read_entry`` checks the size and the header, then verifies each chunk
before handing it on, in order; a bad file raises ``CorruptFile`` naming
what is wrong. An entry of at most one chunk is therefore never handed on
at all when its file is bad; in a longer one, the chunks before the bad one
have been.

Durability: no file is ever fsynced. KV-disk is a cache that never outlives
its process (wiped at start), a file is used only after its writer renamed
it complete, and every byte is MAC-checked on the way back, so a torn or
stale file is refused (``CorruptFile``), never served.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from pathlib import Path

import numpy as np

from ignis.shared.process_lock import hold_directory_itself
from ignis.shared.secret_file import load_secret
from ignis.tierd import disk_io, disk_mac
from ignis.shared.fault_env import env_seconds

MARKER = ".ignis-kv-disk"
SUFFIX = ".kv"
PART = ".kv.part"
MAGIC = b"IGNISKV3"
_OLD_FORMATS = {b"IGNISKV1": "format 1 (keyed blake2b)", b"IGNISKV2": "format 2 (HMAC-SHA256 per chunk)"}
_PREFIX = struct.Struct("<8sII")
CHUNK_BYTES = 16 << 20
RETRY_AFTER_S = 30.0
"""After a failed write (disk full, I/O error) KV-disk takes no writes for this long, then tries again."""

FAULT_DISK_WRITE_ENV = "IGNIS_TIERD_FAULT_DISK_WRITE_S"
"""Fault injection for tests: every KV-disk write waits this many seconds before its first byte (a slow
disk). The wait is on the disk thread, before anything is read from engine memory or the arena."""


FAULT_DISK_FULL_ENV = "IGNIS_TIERD_FAULT_DISK_FULL"
"""Fault injection for tests: ``1`` makes every KV-disk write fail with ENOSPC (disk full) after its payload
is written and before its tags, so a partial ``.part`` file is on disk when the error is raised."""


def fault_disk_full() -> bool:
    return os.environ.get(FAULT_DISK_FULL_ENV, "") == "1"


def fault_disk_write_s() -> float:
    return env_seconds(FAULT_DISK_WRITE_ENV)


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


def make_dir(path: str | os.PathLike) -> Path:
    """Create the KV-disk directory if it is missing; refuse a path that is not a plain directory."""
    path = Path(os.path.abspath(path))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ForeignFilesError(f"cannot create the KV-disk directory {path}: {e}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ForeignFilesError(f"KV-disk path {path} is not a plain directory; refusing to use it")
    if st.st_uid != os.geteuid():  # its owner could swap it for a link to files of ours at any time
        raise ForeignFilesError(f"KV-disk directory {path} is owned by uid {st.st_uid}, not by this process's "
                                f"({os.geteuid()}); refusing to use it")
    return path


def _write_marker(path: Path, exclusive: bool = False) -> None:
    """The marker file, never through a link planted in its place."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path / MARKER, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("KV-disk of an ignis tierd; wiped at its start and exit\n")


def prepare_dir(path: str | os.PathLike) -> Path:
    """Create or wipe the KV-disk directory and leave only the marker in it."""
    path = make_dir(path)
    try:
        names = os.listdir(path)
    except OSError as e:
        raise ForeignFilesError(f"cannot read the KV-disk directory {path}: {e}") from None
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
    error = wipe_dir(path, remove=False)
    try:
        if error:
            raise OSError(error)
        os.chmod(path, 0o700)
        _write_marker(path)
    except OSError as e:
        raise ForeignFilesError(f"cannot prepare the KV-disk directory {path} (tierd must be able to write "
                                f"and delete files in it): {e}") from None
    return path


def wipe_dir(path: str | os.PathLike, remove: bool = True) -> str:
    """Remove tierd's files (and with ``remove`` the marker and the directory, if then empty): "" when every
    file went, else the first error (a directory made read-only or immutable keeps its files; never raised,
    so a stop or a new session goes on)."""
    path = Path(path)
    try:  # through the directory itself, never a link put in its place (whose target's files are not ours)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return f"KV-disk path {path} is no longer a plain directory; nothing in it was deleted"
        return str(e)
    error = ""
    try:
        for name in os.listdir(fd):
            try:
                if name != MARKER and _ours(name) and stat.S_ISREG(
                        os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                error = error or str(e)
        if remove and not error:
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(MARKER, dir_fd=fd)
                os.rmdir(path)
            except OSError:
                pass  # someone put a file there meanwhile; it stays, and so does the directory
    except OSError as e:
        error = error or str(e)
    finally:
        os.close(fd)
    return error


def encode_header(key: str, stamp: str, nbytes: int, shape: tuple[str, ...], session: str = "") -> bytes:
    import orjson  # noqa: PLC0415 - here, so the copy path imports without it (bench/gpu_tiers.py)

    return orjson.dumps({"key": key, "stamp": stamp, "payload_bytes": nbytes, "shape": list(shape),
                         "session": session})


def chunk_count(nbytes: int, chunk: int = CHUNK_BYTES) -> int:
    return max(1, -(-nbytes // chunk))


def trailer_bytes(nbytes: int, chunk: int = CHUNK_BYTES) -> int:
    """Bytes after the payload: the nonce and a tag per chunk."""
    return disk_mac.NONCE_BYTES + disk_mac.TAG_BYTES * chunk_count(nbytes, chunk)


def file_bytes(header: bytes, nbytes: int, chunk: int = CHUNK_BYTES) -> int:
    """Bytes a file of this header and payload takes."""
    return _PREFIX.size + len(header) + nbytes + trailer_bytes(nbytes, chunk)


MAC_KEY_BYTES = disk_mac.KEY_BYTES


class MacKeyError(RuntimeError):
    """The MAC key file cannot be used (readable by others, wrong size, not a file)."""


def load_mac_key(path: str | os.PathLike) -> bytes:
    """The install's KV-disk MAC key at ``path``, created (mode 0600, random) when absent; a file
    readable or writable by anyone but its owner, or of the wrong size, is refused."""
    return load_secret(path, MAC_KEY_BYTES, "KV-disk MAC key", MacKeyError, hint=f" (chmod 600 {path})")


def _window(header: bytes) -> tuple[int, int]:
    """(s, base): the payload starts ``s`` bytes into the aligned window at file offset ``base``."""
    at = _PREFIX.size + len(header)
    return at % disk_io.ALIGN, at - at % disk_io.ALIGN


def _seal(fd: int, buf: np.ndarray, s: int, n: int, body: int, offset: int, key: bytes, free) -> bytes:
    """Tag one chunk (``buf[s:s+n]``) and write the aligned front ``buf[:body]`` of its window (an I/O thread)."""
    try:
        tag = disk_mac.chunk_tag(key, buf[s:s + n])
        if body:
            disk_io.pwrite_all(fd, buf[:body], offset)
        return tag
    finally:
        free.put(buf)


def write_entry(path: Path, header: bytes, source: Callable[[int, np.ndarray], None] | Iterable, nbytes: int,
                mac_key: bytes, chunk: int = CHUNK_BYTES, io: disk_io.DiskIO | None = None) -> int:
    """Write an entry to ``<path>.part``, then rename it to ``path``; returns the file's bytes. A partial
    file is removed on any error.

    ``source`` is ``fill(i, dst)``, writing payload chunk ``i`` into ``dst``
    (called in order, on this thread), or an iterable of pieces (any sizes,
    ``nbytes`` in all). Chunk ``i`` goes into a staging buffer behind the
    ``s`` bytes that precede it in its aligned window (the header's tail, or
    the last bytes of chunk ``i - 1``); an I/O thread MACs it and writes the
    window's aligned front while the next chunk is filled. The unaligned
    rest, the nonce and the tags go last, then the file is cut to its exact size.
    """
    if len(mac_key) != MAC_KEY_BYTES:
        raise ValueError(f"a KV-disk MAC key is {MAC_KEY_BYTES} bytes")
    delay = fault_disk_write_s()
    if delay:
        time.sleep(delay)
    fill = source if callable(source) else disk_io.Stream(source, nbytes)
    own = io is None
    io = io or disk_io.DiskIO(chunk)
    part = path.with_name(path.name + ".part")
    nonce = disk_mac.new_nonce()
    s, base = _window(header)
    front = _PREFIX.pack(MAGIC, len(header), chunk) + header
    jobs: list[Future] = []
    fd = -1
    try:
        fd, _direct = io.open_file(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW)
        if base:
            head = disk_io.aligned_buffer(base)
            head[:] = np.frombuffer(front[:base], dtype=np.uint8)
            disk_io.pwrite_all(fd, head, 0)
        carry, at = front[base:], base
        for i in range(chunk_count(nbytes, chunk)):
            n = min(chunk, nbytes - i * chunk)
            buf = io.buffers.get()
            try:
                buf[:s] = np.frombuffer(carry, dtype=np.uint8)
                fill(i, buf[s:s + n])
            except BaseException:
                io.buffers.put(buf)
                raise
            body = (s + n) // disk_io.ALIGN * disk_io.ALIGN
            carry = bytes(buf[body:s + n])  # the next window's first bytes (or the file's last payload bytes)
            key = disk_mac.chunk_key(mac_key, nonce, header, i)
            jobs.append(io.pool.submit(_seal, fd, buf, s, n, body, at, key, io.buffers))
            at += body
        if isinstance(fill, disk_io.Stream):
            fill.end()
        tail = carry + nonce + b"".join(j.result() for j in jobs)
        if fault_disk_full():
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({FAULT_DISK_FULL_ENV})", str(part))
        last = disk_io.aligned_buffer(disk_io.round_up(len(tail)))
        last[:len(tail)] = np.frombuffer(tail, dtype=np.uint8)
        disk_io.pwrite_all(fd, last, at)
        os.ftruncate(fd, file_bytes(header, nbytes, chunk))  # the zero padding of the last window goes
    except BaseException:
        wait(jobs)
        if fd >= 0:
            os.close(fd)
        part.unlink(missing_ok=True)
        if own:
            io.close()
        raise
    os.close(fd)
    if own:
        io.close()
    os.replace(part, path)
    return file_bytes(header, nbytes, chunk)


def _load(fd: int, buf: np.ndarray, s: int, n: int, offset: int, direct: bool, key: bytes, want: bytes, name: str,
          index: int) -> None:
    """Read chunk ``index``'s window into ``buf`` and check its MAC (an I/O thread)."""
    length = disk_io.round_up(s + n) if direct else s + n
    if disk_io.pread_all(fd, buf[:length], offset) < s + n:
        raise CorruptFile(f"KV-disk file {name}: short read in chunk {index}", "short_read")
    if not disk_mac.tag_matches(key, buf[s:s + n], want):
        raise CorruptFile(f"KV-disk file {name} fails the Poly1305 checksum (MAC) of chunk {index} (corrupt, "
                          f"or not written by this install)", "checksum")


def read_entry(path: Path, header: bytes, nbytes: int, consume: Callable[[int, np.ndarray], None], mac_key: bytes,
               chunk: int = CHUNK_BYTES, io: disk_io.DiskIO | None = None, start: int = 0) -> None:
    """Read and verify ``path``; ``consume(payload_offset, chunk_view)`` gets each good chunk, in order,
    from the one holding payload byte ``start`` (each chunk has its own tag: those before are not read).

    I/O threads read and verify up to ``io.threads`` chunks ahead; a chunk
    is handed on only once it and every chunk before it passed. Raises
    ``CorruptFile`` when the file is gone, truncated, for another entry or
    stamp, or a chunk fails its MAC. ``chunk_view`` is valid only during the call.
    """
    expect = file_bytes(header, nbytes, chunk)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CorruptFile(f"KV-disk file {path.name} is gone", "gone") from None
    own = io is None
    io = io or disk_io.DiskIO(chunk)
    data_fd, pending = fd, deque()
    try:
        size = os.fstat(fd).st_size
        if size != expect:
            raise CorruptFile(f"KV-disk file {path.name} is {size} bytes, expected {expect} (truncated or extended)", "size")
        magic, hlen, file_chunk = _PREFIX.unpack(os.pread(fd, _PREFIX.size, 0))
        if magic in _OLD_FORMATS:
            raise CorruptFile(f"KV-disk file {path.name} is in {_OLD_FORMATS[magic]} ({magic!r}) of an older tierd; "
                              f"this one reads {MAGIC!r} only", "header")
        if magic != MAGIC or file_chunk != chunk:
            raise CorruptFile(f"KV-disk file {path.name} does not start with {MAGIC!r} and chunk size {chunk}", "header")
        if hlen != len(header) or os.pread(fd, hlen, _PREFIX.size) != header:
            raise CorruptFile(f"KV-disk file {path.name} has another header (key, stamp or layout differ)", "header")
        k = chunk_count(nbytes, chunk)
        trailer = os.pread(fd, trailer_bytes(nbytes, chunk), _PREFIX.size + hlen + nbytes)
        nonce, tags = trailer[:disk_mac.NONCE_BYTES], trailer[disk_mac.NONCE_BYTES:]
        s, base = _window(header)
        direct = False
        if io.direct:
            data_fd, direct = io.open_file(path, os.O_RDONLY | os.O_NOFOLLOW)

        def submit(i: int) -> None:
            buf, n = io.buffers.get(), min(chunk, nbytes - i * chunk)
            want = tags[i * disk_mac.TAG_BYTES:(i + 1) * disk_mac.TAG_BYTES]
            pending.append((buf, n, io.pool.submit(_load, data_fd, buf, s, n, base + i * chunk, direct,
                                                   disk_mac.chunk_key(mac_key, nonce, header, i), want, path.name,
                                                   i)))

        first = min(start // chunk, k)
        for i in range(first, min(k, first + io.threads)):
            submit(i)
        for i in range(first, k):
            buf, n, job = pending.popleft()
            try:
                job.result()
                consume(i * chunk, buf[s:s + n])
            finally:
                io.buffers.put(buf)
            if i + io.threads < k:
                submit(i + io.threads)
    finally:
        wait([job for _, _, job in pending])
        for buf, _, _ in pending:
            io.buffers.put(buf)
        if data_fd != fd:
            os.close(data_fd)
        os.close(fd)
        if own:
            io.close()

class DiskTier:
    """The directory, its byte ceiling and its I/O mode; ``used`` counts reserved and written files."""

    def __init__(self, path: Path, ceiling: int, mac_key: bytes, chunk: int = CHUNK_BYTES,
                 retry_after_s: float = RETRY_AFTER_S, clock: Callable[[], float] = time.monotonic,
                 direct: bool | None = None):
        if ceiling <= 0:
            raise ValueError("a DiskTier needs a positive byte ceiling (0 means KV-disk off)")
        if len(mac_key) != MAC_KEY_BYTES:
            raise ValueError(f"a KV-disk MAC key is {MAC_KEY_BYTES} bytes")
        disk_mac.poly1305()  # an install without ``cryptography`` has no KV-disk: ImportError now, not at a write
        self.path = Path(path)
        self.mac_key = mac_key
        self.ceiling = ceiling
        self.chunk = chunk
        self.direct = disk_io.direct_io_works(self.path) if direct is None else direct
        """Files are opened with O_DIRECT (None: when a probe file in the directory takes it)."""
        self.session = secrets.token_hex(8)
        """In every file header this tier writes: a file under one of its names that another tierd (or an
        earlier session) wrote fails the header check."""
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

    def remove(self, key: str) -> OSError | None:
        """Unlink an entry's files; the error when that failed (the directory replaced, made read-only or
        immutable): KV-disk then takes no writes for ``retry_after_s``, and the caller forgets the entry
        all the same (its bytes leave the ceiling; a file left behind goes at the next wipe)."""
        try:
            self.file_path(key).unlink(missing_ok=True)
            self.file_path(key).with_name(f"{key}{PART}").unlink(missing_ok=True)
        except OSError as e:
            self.failed()
            return e
        return None

    def vanished(self) -> bool:
        """The directory is gone (removed, or replaced by something that is not a directory)."""
        try:
            return not stat.S_ISDIR(os.lstat(self.path).st_mode)
        except OSError:
            return True

    def recreate(self) -> str:
        """Make a vanished directory again with its marker: "" when done, else why not. Nothing is wiped (a
        write in flight on a disk thread may already have its file there); a directory someone else made
        meanwhile with files not ours in it is refused."""
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            st = os.lstat(self.path)
            if not stat.S_ISDIR(st.st_mode):
                return f"KV-disk path {self.path} is not a plain directory"
            if st.st_uid != os.geteuid():  # another user made it first: theirs to swap or fill with links
                return f"KV-disk directory {self.path} was made again by uid {st.st_uid}, not this process's"
            os.chmod(self.path, 0o700)
            hold_directory_itself(self.path, f"the KV-disk directory {self.path}", wait_s=0)
            foreign = [n for n in os.listdir(self.path) if not _ours(n)]
            if foreign:
                return f"KV-disk directory {self.path} now holds files tierd did not create ({foreign[0]}, ...)"
            if MARKER not in os.listdir(self.path):
                _write_marker(self.path, exclusive=True)
        except OSError as e:
            return str(e)
        return ""

    def files(self) -> list[str]:
        """Names of the entry files in the directory now (none if the directory is gone)."""
        try:
            names = os.listdir(self.path)
        except OSError:  # gone, or replaced by something that is not a directory
            return []
        return sorted(n for n in names if n.endswith(SUFFIX) or n.endswith(PART))
