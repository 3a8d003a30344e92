"""One process per ipc socket, per KV-disk directory and per ``ignis serve`` instance: exclusive locks.

libzmq's ipc bind unlinks a socket file already there, so a second engine or
tierd started on the same ``--runtime-dir`` and ``--instance`` (a second
``ignis serve`` by mistake, or a restart while the previous children still
drain after their supervisor was killed) would silently take the first one's
sockets over, and a second tierd on the same KV-disk directory would wipe the
first one's files. So each of them first takes an exclusive ``flock``: on
``<socket path>.lock`` beside an ipc socket (an abstract ``ipc://@name`` needs
none: a second bind of it fails by itself), on ``<directory>.lock`` beside the
KV-disk directory (which tierd removes and makes again while it holds it) and
on the directory itself (the same directory reached by another path, a bind
mount, has another file beside it), on
``<runtime-dir>/<instance>-serve.lock`` for ``ignis serve``. The holder writes
its pid into a lock file, for the message a loser gets.

A lock held by another process is waited for up to ``wait_s`` (the previous
children of a killed supervisor exit within their shutdown timeout), with one
log line saying who holds it; then ``LockBusy`` (an ``OSError``, so a start
fails with the usual exit code 2 and one line). ``ignis serve`` does not wait:
another live supervisor of the same instance is a mistake to report at once.
The kernel drops a lock when its process exits, however it exits (kill -9
included); the lock files stay, harmless (deleting one would let a second
process lock a new file while a third still waits on the old one). A socket
file is the holder's to delete on its way out (``remove_socket_file``, still
under the lock, so never a successor's socket). Locks are held for the life of the
process (their descriptors are kept here, closed on exec). No torch.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import time

log = logging.getLogger(__name__)

POLL_S = 0.1
_held: list[int] = []  # descriptors of the locks this process holds, for its whole life


class LockBusy(OSError):
    """Another process holds the lock past the wait; the message names it and what to do."""

    def __init__(self, message: str):
        super().__init__(errno.EBUSY, message)

    def __str__(self) -> str:
        return self.strerror


def hold_endpoint(endpoint: str, what: str, wait_s: float) -> None:
    """Lock ``<path>.lock`` for an ``ipc://<path>`` endpoint (other transports, and abstract ``ipc://@name``
    sockets: nothing to do, a second bind fails by itself)."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        hold_file(os.path.abspath(endpoint[len("ipc://"):]) + ".lock", what, wait_s)


def remove_socket_file(endpoint: str) -> None:
    """Delete the socket file of an ``ipc://<path>`` endpoint this process bound and locked, on its way out
    (libzmq leaves it behind); anything else at that path, or nothing, is left alone."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return
    path = os.path.abspath(endpoint[len("ipc://"):])
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            log.warning("cannot delete the socket file %s: %s", path, e)


def hold_file(path: str | os.PathLike, what: str, wait_s: float) -> None:
    """Lock the file at ``path`` (created mode 0600) and write this process's pid into it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    _take(fd, os.fspath(path), what, wait_s, pid_file=True)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def hold_directory(path: str | os.PathLike, what: str, wait_s: float) -> None:
    """Lock ``<path>.lock`` beside the directory at ``path`` (it outlives the directory, which its holder
    may remove and make again), then the directory itself: another path to it (a bind mount) has
    another file beside it but the same directory. Where the parent takes no new file, the directory
    only."""
    path = os.path.abspath(path)
    try:
        hold_file(path.rstrip("/") + ".lock", what, wait_s)
    except OSError as e:  # LockBusy among them: only a parent that takes no file falls back
        if not isinstance(e, (PermissionError, IsADirectoryError)) and e.errno != errno.EROFS:
            raise
        log.info("no lock file beside %s (%s): locking the directory itself", path, e)
    _hold_inode(path, what, wait_s)


def hold_directory_itself(path: str | os.PathLike, what: str, wait_s: float) -> None:
    """Lock the directory at ``path`` itself: for one made again while its holder serves (it was removed
    from under it), so another path to it is refused as before."""
    _hold_inode(os.path.abspath(path), what, wait_s)


def _hold_inode(path: str, what: str, wait_s: float) -> None:
    """Lock the directory at ``path`` itself (nothing is written into it). A holder that removes it as
    it exits leaves the lock on a directory no longer there: taken again on the one at ``path`` now."""
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:  # removed by the holder as it exited: made again, and locked
            os.makedirs(path, mode=0o700, exist_ok=True)
            continue
        _take(fd, os.fspath(path), what, deadline - time.monotonic(), pid_file=False)
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return
        _held.remove(fd)
        os.close(fd)


def _take(fd: int, path: str, what: str, wait_s: float, pid_file: bool) -> None:
    deadline = time.monotonic() + max(0.0, wait_s)
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _held.append(fd)
            if said:
                log.info("%s is free now (%s)", what, path)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
        holder = _holder(fd) if pid_file else None
        by = f"pid {holder}" if holder else "another process"
        if time.monotonic() >= deadline:
            os.close(fd)
            waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
            raise LockBusy(f"{what} is in use by {by}{waited} ({path} is locked): another ignis process "
                           f"serves it; stop that one, or give this one another --instance or --runtime-dir "
                           f"(or another --kv-disk-dir)")
        if not said:
            log.warning("%s is in use by %s (%s is locked); waiting up to %g s for it to exit", what, by, path,
                        wait_s)
            said = True
        time.sleep(POLL_S)


def _holder(fd: int) -> int | None:
    """The pid the holder wrote into the lock file, if it did."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
