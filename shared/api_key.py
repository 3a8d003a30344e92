"""Where the gateway's API key comes from (read by the gateway, checked first by `ignis serve`): a file,
the environment, or (discouraged) the command line.

    --api-key-file PATH   the file's content, whitespace around it dropped; refused unless
                          the file's mode gives nothing to group or others (0600 or stricter)
    IGNIS_API_KEY         the environment (systemd: an EnvironmentFile, or a credential read
                          through $CREDENTIALS_DIRECTORY by the unit's ExecStart)
    --api-key KEY [KEY]   works, with a warning: every local user can read it in the process list

At most one of them may be given. Each may hold several keys (one per line in
the file and the variable, several values of the flag, as vLLM takes them);
any of them is accepted. The resolved value holds the keys one per line
(``keys_of`` splits it). A key itself is never logged.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("ignis.api_key")

API_KEY_ENV = "IGNIS_API_KEY"
FLAG_WARNING = ("--api-key puts the key on the command line, where every local user can read it (ps, "
                "/proc/PID/cmdline); use --api-key-file or IGNIS_API_KEY instead")


def read_key_file(path: str) -> str:
    """The key in ``path``; ValueError when the file is readable by others, empty, or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ValueError(f"--api-key-file {path}: cannot open it: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"--api-key-file {path}: not a regular file")
        if mode & 0o077:
            raise ValueError(f"--api-key-file {path}: its mode is {stat.S_IMODE(mode):04o}; others may read it "
                             f"(chmod 600 {path})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(64 << 10)
    finally:
        os.close(fd)
    try:
        key = raw.decode().strip()
    except UnicodeDecodeError:
        raise ValueError(f"--api-key-file {path}: not UTF-8 text") from None
    if not key:
        raise ValueError(f"--api-key-file {path}: the file is empty")
    return key


def keys_of(value: str | None) -> tuple[str, ...]:
    """The keys of a resolved value (one per line, blank lines and surrounding whitespace dropped)."""
    return tuple(k.strip() for k in (value or "").splitlines() if k.strip())


def resolve_api_key(flag: str | list[str] | tuple[str, ...] | None, key_file: str | None, environ=os.environ,
                    warn=log.warning) -> str | None:
    """The keys from whichever one source is given, one per line (none: no auth); ValueError for two
    sources, a bad file or a blank key on the command line. ``warn`` is told when keys came on the command
    line."""
    if isinstance(flag, (list, tuple)):
        if any(not k.strip() or "\n" in k for k in flag):
            raise ValueError("--api-key must not be empty")
        flag = "\n".join(k.strip() for k in flag) or None
    env = environ.get(API_KEY_ENV) or None
    given = [name for name, v in (("--api-key", flag), ("--api-key-file", key_file), (API_KEY_ENV, env)) if v]
    if len(given) > 1:
        raise ValueError(f"the API key is given {len(given)} ways ({', '.join(given)}); give it one way")
    if key_file:
        return read_key_file(key_file)
    if flag:
        warn(FLAG_WARNING)
        return flag
    return env
