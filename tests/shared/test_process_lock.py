"""shared.process_lock: one holder at a time, a bounded wait for a holder that exits, the holder's pid
in the refusal, and a directory lock taken again when its holder removed the directory as it exited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ignis.shared import process_lock
from ignis.shared.process_lock import LockBusy, hold_directory, hold_endpoint, hold_file

HOLDER = textwrap.dedent("""
    import os, sys
    from ignis.shared import process_lock
    kind, path = sys.argv[1], sys.argv[2]
    take = {"dir": process_lock.hold_directory, "inode": process_lock._hold_inode, "file": process_lock.hold_file}
    take[kind](path, "the thing", wait_s=0)
    print("HELD", flush=True)
    sys.stdin.readline()  # until the test closes our stdin
    if kind != "file" and os.path.isdir(path):
        os.rmdir(path)  # as tierd removes its KV-disk directory as it exits
""")


class Holder:
    """A process holding a lock until ``release``."""

    def __init__(self, kind: str, path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "HELD"

    def release(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0


@pytest.fixture(autouse=True)
def forget_held():
    """Each test's locks are dropped at its end (a process keeps them for its life)."""
    yield
    while process_lock._held:
        os.close(process_lock._held.pop())


def test_a_held_file_is_refused_at_once_with_the_holders_pid(tmp_path):
    path = tmp_path / "x.lock"
    holder = Holder("file", path)
    try:
        with pytest.raises(LockBusy) as e:
            hold_file(path, "instance 'x'", wait_s=0)
        assert f"instance 'x' is in use by pid {holder.proc.pid}" in str(e.value)
        assert isinstance(e.value, OSError)
    finally:
        holder.release()
    hold_file(path, "instance 'x'", wait_s=0)  # free once its holder is gone
    assert path.read_text() == f"{os.getpid()}\n"


def test_a_waiter_gets_the_lock_when_its_holder_exits(tmp_path):
    path = tmp_path / "x.lock"
    holder = Holder("file", path)
    waiter = subprocess.Popen([sys.executable, "-c",
                               "import sys; from ignis.shared.process_lock import hold_file; "
                               "hold_file(sys.argv[1], 'x', wait_s=60); print('GOT', flush=True)", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the waiter says once that it waits (and who holds the lock), then takes it as the holder exits
        said = waiter.stderr.readline()
        assert f"in use by pid {holder.proc.pid}" in said and "waiting up to 60 s" in said
        holder.release()
        assert waiter.stdout.readline().strip() == "GOT"
        assert waiter.wait(30) == 0
    finally:
        waiter.kill()


def test_a_wait_past_its_bound_is_refused(tmp_path):
    path = tmp_path / "x.lock"
    holder = Holder("file", path)
    try:
        with pytest.raises(LockBusy, match=r"after waiting 0\.3 s"):
            hold_file(path, "x", wait_s=0.3)
    finally:
        holder.release()


def test_an_ipc_endpoint_locks_beside_its_socket_and_tcp_needs_nothing(tmp_path):
    hold_endpoint(f"ipc://{tmp_path}/a-engine.sock", "the engine socket", wait_s=0)
    assert (tmp_path / "a-engine.sock.lock").exists()
    hold_endpoint("tcp://127.0.0.1:5555", "the engine socket", wait_s=0)
    assert sorted(os.listdir(tmp_path)) == ["a-engine.sock.lock"]


def test_a_directory_lock_outlives_the_directory(tmp_path):
    """tierd removes its KV-disk directory when a session has no disk and makes it again later: the lock
    is a file beside the directory, so a second tierd is refused all the same (naming the holder)."""
    d = tmp_path / "kv"
    d.mkdir()
    holder = Holder("dir", d)  # holds, and removes the directory as it exits
    try:
        assert (tmp_path / "kv.lock").exists()
        d.rmdir()  # removed mid-life
        d.mkdir()
        with pytest.raises(LockBusy, match=f"in use by pid {holder.proc.pid}"):
            hold_directory(d, "the KV-disk directory", wait_s=0)
        d.rmdir()
    finally:
        d.mkdir()
        holder.release()
    hold_directory(d, "the KV-disk directory", wait_s=0)  # free once its holder is gone


def test_where_no_file_can_go_beside_it_the_directory_itself_is_locked(tmp_path, monkeypatch):
    d = tmp_path / "kv"
    d.mkdir()

    def read_only(path, what, wait_s):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(process_lock, "hold_file", read_only)
    hold_directory(d, "the KV-disk directory", wait_s=0)
    assert not (tmp_path / "kv.lock").exists()
    with pytest.raises(LockBusy):  # another descriptor of the same directory: refused
        process_lock._hold_inode(str(d), "the KV-disk directory", wait_s=0)


def test_an_inode_lock_removed_by_its_holder_is_taken_again_where_the_directory_is_now(tmp_path):
    d = tmp_path / "kv"
    d.mkdir()
    holder = Holder("inode", d)
    with pytest.raises(LockBusy):
        process_lock._hold_inode(str(d), "the KV-disk directory", wait_s=0)
    waiter = subprocess.Popen([sys.executable, "-c",
                               "import sys, os; from ignis.shared import process_lock; "
                               "process_lock._hold_inode(sys.argv[1], 'x', wait_s=60); "
                               "print(os.stat(sys.argv[1]).st_ino, flush=True); sys.stdin.readline()", str(d)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "waiting up to 60 s" in waiter.stderr.readline()  # it holds the directory that goes away
        holder.release()  # removes the directory as it exits
        ino = int(waiter.stdout.readline())
        assert d.is_dir() and d.stat().st_ino == ino  # the waiter made it again and holds the new one
        with pytest.raises(LockBusy):
            process_lock._hold_inode(str(d), "the KV-disk directory", wait_s=0)
    finally:
        waiter.stdin.close()
        waiter.wait(30)


def test_an_abstract_or_relative_ipc_endpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hold_endpoint("ipc://@ignis-test-abstract", "the engine socket", wait_s=0)  # nothing on disk
    assert os.listdir(tmp_path) == []
    (tmp_path / "rel").mkdir()
    hold_endpoint("ipc://rel/e.sock", "the engine socket", wait_s=0)
    assert (tmp_path / "rel" / "e.sock.lock").exists()
    with pytest.raises(LockBusy):  # the same file, named absolutely
        hold_file(tmp_path / "rel" / "e.sock.lock", "the engine socket", wait_s=0)


BIND_MOUNT_CHECK = textwrap.dedent("""
    import sys
    from ignis.shared.process_lock import LockBusy, hold_directory
    hold_directory(sys.argv[1], "the KV-disk directory", wait_s=0)
    try:
        hold_directory(sys.argv[2], "the KV-disk directory", wait_s=0)
    except LockBusy as e:
        print("REFUSED", e)
    else:
        print("TAKEN")
""")


def test_one_directory_reached_by_another_path_is_refused(tmp_path):
    """A bind mount of a KV-disk directory has its own file beside it; the directory itself is one: a
    second tierd on it is refused (it would wipe the first one's files)."""
    a, b = tmp_path / "a" / "kv", tmp_path / "b" / "kv"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    inner = f"mount --bind {a} {b} && exec {sys.executable} -c '{BIND_MOUNT_CHECK}' {a} {b}"
    try:
        out = subprocess.run(["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if out.returncode != 0 and "REFUSED" not in out.stdout and "TAKEN" not in out.stdout:
        pytest.skip(f"no bind mount in a user namespace here: {out.stderr.strip()[:200]}")
    assert out.stdout.startswith("REFUSED") and "the KV-disk directory is in use" in out.stdout, out


def test_the_socket_file_of_an_ipc_endpoint_is_deleted_and_nothing_else(tmp_path):
    import socket

    from ignis.shared.process_lock import remove_socket_file

    path = tmp_path / "x-engine.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    remove_socket_file(f"ipc://{path}")
    assert not path.exists()
    remove_socket_file(f"ipc://{path}")  # nothing there: nothing to do
    path.write_text("not a socket")
    remove_socket_file(f"ipc://{path}")
    remove_socket_file("tcp://127.0.0.1:5555")
    assert path.read_text() == "not a socket"
