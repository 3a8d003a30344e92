"""The runtime directory and the per-instance socket endpoints inside it.

Layout (one directory per user, several instances side by side):

    <runtime-dir>/                      mode 0700, owned by this user
        <instance>-engine.sock          engine ROUTER (gateways connect)
        <instance>-tierd.sock           tierd ROUTER (the engine connects)
        <instance>-events.sock          engine PUB of KV events (routers subscribe)

The default directory is ``$XDG_RUNTIME_DIR/ignis``, or ``/tmp/ignis-$UID``
when that variable is unset. ``ensure_runtime_dir`` creates it mode 0700,
tightens the mode of an existing one we own, and refuses (``RuntimeDirError``)
a symlink, a non-directory or a directory owned by someone else: a socket in a
directory another user controls could be replaced under us.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MODE = 0o700
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes including the NUL on Linux


class RuntimeDirError(RuntimeError):
    """The runtime directory cannot be used safely; the message says why and what to do."""


def default_runtime_dir() -> Path:
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "ignis"
    return Path(f"/tmp/ignis-{os.getuid()}")


def ensure_runtime_dir(path: str | os.PathLike | None = None) -> Path:
    """Create (or check) the runtime directory and return its absolute path."""
    path = Path(path) if path is not None else default_runtime_dir()
    path = Path(os.path.abspath(path))
    try:
        os.mkdir(path, MODE)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise RuntimeDirError(f"cannot create runtime dir {path}: its parent does not exist "
                              f"(create it or pass --runtime-dir)") from None
    except PermissionError:
        raise RuntimeDirError(f"cannot create runtime dir {path}: permission denied (pass --runtime-dir)") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeDirError(f"runtime dir {path} is a symlink; refusing to use it (remove it or pass --runtime-dir)")
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"runtime dir {path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(
            f"runtime dir {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}); "
            f"refusing to put sockets there (pass --runtime-dir)"
        )
    if stat.S_IMODE(st.st_mode) != MODE:
        os.chmod(path, MODE)  # also undoes a umask that made mkdir's mode looser or tighter
    return path


def check_instance_name(name: object, flag: str = "") -> str:
    """Instance names go into file names: 1-64 of ``[A-Za-z0-9._-]``, starting alphanumeric. ``flag``: the
    command-line flag that gave it, named first in the error."""
    if type(name) is not str or not _INSTANCE.fullmatch(name):
        raise ValueError(f"{flag + ': ' if flag else ''}instance name must be 1-64 characters of letters, "
                         f"digits, '.', '_', '-', starting with a letter or digit; got {name!r}")
    return name


@dataclass(frozen=True)
class Endpoints:
    """ZeroMQ endpoints of one instance."""

    engine: str
    tierd: str
    events: str


def ipc_endpoint(runtime_dir: str | os.PathLike, instance: str, role: str) -> str:
    """``ipc://<runtime_dir>/<instance>-<role>.sock``; refuses paths too long for a Unix socket."""
    check_instance_name(instance)
    if not re.fullmatch(r"[a-z]+", role):
        raise ValueError(f"role must be lowercase letters, got {role!r}")
    sock = os.path.join(os.fspath(runtime_dir), f"{instance}-{role}.sock")
    if len(os.fsencode(sock)) > _SUN_PATH_MAX:
        raise ValueError(f"socket path {sock} is {len(os.fsencode(sock))} bytes; Unix sockets allow "
                         f"{_SUN_PATH_MAX} (use a shorter --runtime-dir or instance name)")
    return f"ipc://{sock}"


def endpoints(runtime_dir: str | os.PathLike, instance: str = "default") -> Endpoints:
    """All endpoints of ``instance`` under ``runtime_dir`` (which is not created here)."""
    return Endpoints(**{role: ipc_endpoint(runtime_dir, instance, role) for role in ("engine", "tierd", "events")})
