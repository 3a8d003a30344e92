"""The runtime directory: created 0700, mode fixed when ours, refused when unsafe; endpoint names."""

from __future__ import annotations

import os
import stat

import pytest

from ignis.shared.runtime import (
    RuntimeDirError,
    check_instance_name,
    default_runtime_dir,
    endpoints,
    ensure_runtime_dir,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_default_follows_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_runtime_dir() == tmp_path / "ignis"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert str(default_runtime_dir()) == f"/tmp/ignis-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")
    assert str(default_runtime_dir()) == f"/tmp/ignis-{os.getuid()}"


def test_created_with_mode_0700(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    old = os.umask(0o700)  # mkdir(path, 0o700) alone would then create mode 0000
    try:
        path = ensure_runtime_dir()
    finally:
        os.umask(old)
    assert path == tmp_path / "ignis" and path.is_dir()
    assert _mode(path) == 0o700
    assert ensure_runtime_dir() == path  # idempotent


def test_existing_dir_mode_is_tightened(tmp_path):
    target = tmp_path / "rt"
    target.mkdir()
    os.chmod(target, 0o755)
    ensure_runtime_dir(target)
    assert _mode(target) == 0o700


def test_symlink_and_file_are_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(RuntimeDirError, match="symlink"):
        ensure_runtime_dir(link)
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(RuntimeDirError, match="not a directory"):
        ensure_runtime_dir(afile)
    with pytest.raises(RuntimeDirError, match="parent does not exist"):
        ensure_runtime_dir(tmp_path / "missing" / "rt")


def test_dir_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "theirs"
    target.mkdir()
    os.chmod(target, 0o777)
    monkeypatch.setattr(os, "getuid", lambda: os.lstat(target).st_uid + 1)
    with pytest.raises(RuntimeDirError, match="owned by uid"):
        ensure_runtime_dir(target)
    assert _mode(target) == 0o777  # left as it was


def test_endpoints_are_per_instance(tmp_path):
    a, b = endpoints(tmp_path, "a"), endpoints(tmp_path, "b")
    assert a.engine == f"ipc://{tmp_path}/a-engine.sock"
    assert a.tierd == f"ipc://{tmp_path}/a-tierd.sock"
    assert a.events == f"ipc://{tmp_path}/a-events.sock"
    assert not {a.engine, a.tierd, a.events} & {b.engine, b.tierd, b.events}


@pytest.mark.parametrize("name", ["", "../x", "a/b", "-lead", "x" * 65, 3, "sp ace"])
def test_bad_instance_names(name):
    with pytest.raises(ValueError, match="instance name"):
        check_instance_name(name)


def test_socket_path_too_long(tmp_path):
    with pytest.raises(ValueError, match="Unix sockets allow"):
        endpoints(tmp_path / ("d" * 100), "x")
