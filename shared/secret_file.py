"""An install's secret key in a file: created random (mode 0600) on first use, refused when others can reach it."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def load_secret(path: str | os.PathLike, nbytes: int, what: str, error=ValueError, hint: str = "") -> bytes:
    """The ``nbytes`` key at ``path``, created (mode 0600, random) when absent. A file that is not regular,
    is owned by another user (who could read it, or change it), is readable or writable by anyone but its
    owner, or holds another size raises ``error`` naming ``what``; ``hint`` is appended to the mode
    message."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(nbytes))
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise error(f"{what} {path} is owned by uid {st.st_uid}, not this process's ({os.geteuid()})")
    if st.st_mode & 0o077:
        raise error(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):o}; it must be 0600 or stricter{hint}")
    key = path.read_bytes()
    if len(key) != nbytes:
        raise error(f"{what} {path} holds {len(key)} bytes, not {nbytes}")
    return key
