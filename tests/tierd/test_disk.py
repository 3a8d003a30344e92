"""KV-disk files and directory: chunked checksums catch any damage before a bad chunk is handed on."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest

from ignis.tierd import disk_io, disk_mac
from ignis.tierd.disk_io import DiskIO, direct_io_works
from ignis.tierd.disk import (
    MARKER,
    CorruptFile,
    DiskTier,
    ForeignFilesError,
    encode_header,
    file_bytes,
    trailer_bytes,
    prepare_dir,
    read_entry,
    wipe_dir,
    write_entry,
    load_mac_key,
    MacKeyError,
)

KEY = "0123456789abcdef" * 2
CHUNK = 4096
MAC = bytes(range(32))


def write(tmp_path, payload: bytes, pieces=3, chunk=CHUNK):
    header = encode_header(KEY, "stamp-1", len(payload), ("kv", "kv", "ssm"))
    step = -(-len(payload) // pieces)
    parts = [np.frombuffer(payload[i:i + step], dtype=np.uint8) for i in range(0, len(payload), step)]
    path = tmp_path / f"{KEY}.kv"
    size = write_entry(path, header, parts, len(payload), MAC, chunk)
    assert size == path.stat().st_size == file_bytes(header, len(payload), chunk)
    return path, header


def read(path, header, nbytes, chunk=CHUNK, mac_key=MAC):
    out = bytearray(nbytes)
    got = []

    def consume(offset, view):
        out[offset:offset + view.nbytes] = view.tobytes()
        got.append(offset)

    try:
        read_entry(path, header, nbytes, consume, mac_key, chunk)
    finally:
        read.handed_on = got
    return bytes(out)


@pytest.mark.parametrize("n", [1, CHUNK - 1, CHUNK, 3 * CHUNK + 17])
def test_write_then_read_any_size(tmp_path, n):
    payload = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    path, header = write(tmp_path, payload)
    assert read(path, header, n) == payload
    assert not (tmp_path / f"{KEY}.kv.part").exists()


def test_a_flipped_byte_is_caught_in_its_chunk_and_later_chunks_are_not_handed_on(tmp_path):
    payload = bytes(range(256)) * 64  # 4 chunks
    path, header = write(tmp_path, payload)
    data = bytearray(path.read_bytes())
    data[len(data) - trailer_bytes(len(payload), CHUNK) - CHUNK - 5] ^= 1  # inside chunk 2
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFile, match=r"checksum \(MAC\) of chunk 2"):
        read(path, header, len(payload))
    assert read.handed_on == [0, CHUNK]


def test_a_read_from_an_offset_skips_the_chunks_before_it(tmp_path):
    """A restore that shares its first pages reads from the chunk holding the rest: a damaged chunk before
    it is not read, one after it is still caught."""
    payload = bytes(range(256)) * 64  # 4 chunks
    path, header = write(tmp_path, payload)
    data = bytearray(path.read_bytes())
    chunk0 = len(data) - trailer_bytes(len(payload), CHUNK) - 4 * CHUNK
    data[chunk0 + 7] ^= 1  # inside chunk 0
    path.write_bytes(bytes(data))
    got = {}
    read_entry(path, header, len(payload), lambda o, v: got.__setitem__(o, v.tobytes()), MAC, CHUNK,
               start=CHUNK + 100)
    assert sorted(got) == [CHUNK, 2 * CHUNK, 3 * CHUNK]
    assert b"".join(got[o] for o in sorted(got)) == payload[CHUNK:]
    with pytest.raises(CorruptFile, match=r"chunk 0"):
        read_entry(path, header, len(payload), lambda o, v: None, MAC, CHUNK, start=CHUNK - 1)


def test_truncation_other_headers_and_missing_files_are_corrupt(tmp_path):
    payload = b"x" * 5000
    path, header = write(tmp_path, payload)
    with pytest.raises(CorruptFile, match="another header"):
        read(path, encode_header(KEY, "stamp-2", 5000, ("kv", "kv", "ssm")), 5000)
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(CorruptFile, match="truncated"):
        read(path, header, 5000)
    path.unlink()
    with pytest.raises(CorruptFile, match="gone"):
        read(path, header, 5000)


def test_a_failed_write_leaves_no_file(tmp_path):
    header = encode_header(KEY, "s", 10, ("kv",))

    def pieces():
        yield b"12345"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_entry(tmp_path / f"{KEY}.kv", header, pieces(), 10, MAC)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="wrote 3 payload bytes"):
        write_entry(tmp_path / f"{KEY}.kv", header, [b"abc"], 10, MAC)
    assert os.listdir(tmp_path) == []


def test_prepare_wipes_only_tierd_files_and_refuses_foreign_ones(tmp_path):
    d = tmp_path / "kv"
    prepare_dir(d)
    assert os.listdir(d) == [MARKER] and (d.stat().st_mode & 0o777) == 0o700
    (d / "a.kv").write_bytes(b"1")
    (d / "b.kv.part").write_bytes(b"2")
    prepare_dir(d)
    assert os.listdir(d) == [MARKER]
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ForeignFilesError, match="notes.txt"):
        prepare_dir(d)
    assert (d / "notes.txt").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "c.kv").write_bytes(b"3")
    with pytest.raises(ForeignFilesError, match="no .ignis-kv-disk marker"):
        prepare_dir(other)
    (tmp_path / "sub" / "x").mkdir(parents=True)
    (tmp_path / "sub" / MARKER).write_text("")
    with pytest.raises(ForeignFilesError, match="x"):
        prepare_dir(tmp_path / "sub")


def test_wipe_removes_the_directory_unless_someone_else_put_a_file_there(tmp_path):
    d = prepare_dir(tmp_path / "kv")
    (d / "a.kv").write_bytes(b"1")
    wipe_dir(d)
    assert not d.exists()
    d = prepare_dir(tmp_path / "kv")
    (d / "keep.txt").write_text("x")
    wipe_dir(d)
    assert os.listdir(d) == ["keep.txt"]


def test_disk_tier_accounting():
    t = DiskTier("/nonexistent", 100, MAC)
    t.reserve(60)
    with pytest.raises(MemoryError):
        t.reserve(41)
    t.release(60)
    assert t.free == 100
    with pytest.raises(ValueError):
        t.release(1)
    with pytest.raises(ValueError, match="0 means KV-disk off"):
        DiskTier("/nonexistent", 0, MAC)


def test_a_file_forged_with_plain_checksums_is_refused(tmp_path):
    """Whoever can write the directory can recompute an unkeyed checksum, not the install's MAC."""
    import hashlib
    import struct

    payload = bytes(range(256)) * 40
    path, header = write(tmp_path, payload)
    raw = bytearray(path.read_bytes())
    prefix = 16 + len(header)
    forged = bytes(len(payload))  # the attacker's payload (all zeros; NaN bytes are no different)
    nonce = bytes(raw[prefix + len(payload):prefix + len(payload) + disk_mac.NONCE_BYTES])  # the file's own
    tags = []
    for i in range(0, len(payload), CHUNK):
        d = hashlib.blake2b(nonce + header, digest_size=disk_mac.TAG_BYTES)
        d.update(struct.pack("<Q", i // CHUNK))
        d.update(forged[i:i + CHUNK])
        tags.append(d.digest())
    raw[prefix:prefix + len(payload)] = forged
    raw[prefix + len(payload) + disk_mac.NONCE_BYTES:] = b"".join(tags)
    assert len(raw) == file_bytes(header, len(payload), CHUNK)  # the right size: only the MAC refuses it
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptFile, match="not written by this install") as e:
        read(path, header, len(payload))
    assert e.value.check == "checksum" and read.handed_on == []
    other = tmp_path / "genuine"
    other.mkdir()
    path2, header2 = write(other, payload)
    with pytest.raises(CorruptFile):  # a genuine file read under another install's key
        read(path2, header2, len(payload), mac_key=bytes(32))


def test_mac_key_file_is_created_0600_and_a_loose_one_refused(tmp_path):
    key_path = tmp_path / "kv-disk.key"
    key = load_mac_key(key_path)
    assert len(key) == 32 and stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert load_mac_key(key_path) == key  # the same install, the same key
    key_path.chmod(0o644)
    with pytest.raises(MacKeyError, match="0600"):
        load_mac_key(key_path)
    key_path.chmod(0o600)
    key_path.write_bytes(b"short")
    with pytest.raises(MacKeyError, match="5 bytes"):
        load_mac_key(key_path)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("n,header_refs", [(5 * CHUNK + 123, 3), (2 * CHUNK, 700), (17, 1)])
def test_pipelined_and_direct_io_round_trip_any_header_and_size(tmp_path, direct, threads, n, header_refs):
    """Chunks MACed and written several at a time, O_DIRECT or not, for payloads at any offset in a window."""
    payload = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    header = encode_header(KEY, "stamp-1", n, ("kv",) * header_refs)
    io = DiskIO(CHUNK, threads=threads, direct=direct)
    try:
        path = tmp_path / f"{KEY}.kv"
        step = CHUNK // 3 + 5
        assert write_entry(path, header, [payload[i:i + step] for i in range(0, n, step)], n, MAC, CHUNK, io) \
            == path.stat().st_size == file_bytes(header, n, CHUNK)
        got, order = bytearray(n), []

        def consume(offset, view):
            got[offset:offset + view.nbytes] = view.tobytes()
            order.append(offset)

        read_entry(path, header, n, consume, MAC, CHUNK, io)
        assert bytes(got) == payload.tobytes() and order == sorted(order)
        assert io.direct == (direct and direct_io_works(tmp_path))
        assert io.buffers.qsize() == threads + 1  # every staging window given back
    finally:
        io.close()


def test_a_filesystem_refusing_o_direct_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(disk_io.os, "open", refusing)
    assert not direct_io_works(tmp_path) and not (tmp_path / ".ignis-direct-probe.kv.part").exists()
    assert not DiskTier(tmp_path, 100, MAC).direct
    io = DiskIO(CHUNK, direct=True)
    try:
        payload = bytes(range(256)) * 50
        header = encode_header(KEY, "s", len(payload), ("kv",))
        write_entry(tmp_path / "a.kv", header, [payload], len(payload), MAC, CHUNK, io)
        assert not io.direct  # the refusal turned O_DIRECT off for good, the file is whole
        out = bytearray()
        read_entry(tmp_path / "a.kv", header, len(payload), lambda o, v: out.extend(v.tobytes()), MAC, CHUNK, io)
        assert bytes(out) == payload
    finally:
        io.close()


@pytest.mark.parametrize("magic,name", [(b"IGNISKV1", "format 1"), (b"IGNISKV2", "format 2")])
def test_an_older_format_file_is_refused_by_name(tmp_path, magic, name):
    payload = b"y" * 5000
    path, header = write(tmp_path, payload)
    data = bytearray(path.read_bytes())
    data[:8] = magic
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFile, match=name) as e:
        read(path, header, len(payload))
    assert e.value.check == "header" and read.handed_on == []


def _payload_at(header: bytes) -> int:
    return 16 + len(header)


def test_chunks_swapped_within_a_file_or_taken_from_another_file_are_refused(tmp_path):
    """A tag binds its chunk to the file (nonce, header) and the position: genuine chunks with their
    genuine tags, moved, fail."""
    payload = bytes(range(256)) * 48  # 3 chunks
    path, header = write(tmp_path, payload)
    genuine = path.read_bytes()
    at, tags = _payload_at(header), len(genuine) - 3 * 16
    swapped = bytearray(genuine)  # chunks 0 and 1 swapped, and their tags with them
    swapped[at:at + CHUNK] = genuine[at + CHUNK:at + 2 * CHUNK]
    swapped[at + CHUNK:at + 2 * CHUNK] = genuine[at:at + CHUNK]
    swapped[tags:tags + 16], swapped[tags + 16:tags + 32] = genuine[tags + 16:tags + 32], genuine[tags:tags + 16]
    path.write_bytes(bytes(swapped))
    with pytest.raises(CorruptFile, match="chunk 0") as e:
        read(path, header, len(payload))
    assert e.value.check == "checksum" and read.handed_on == []
    other = tmp_path / "other"
    other.mkdir()
    other_payload = bytes(reversed(payload))
    path2, _ = write(other, other_payload)  # the same header: another file of the same entry, written apart
    mixed = bytearray(path2.read_bytes())
    mixed[at:at + CHUNK] = genuine[at:at + CHUNK]
    mixed[len(mixed) - 3 * 16:len(mixed) - 2 * 16] = genuine[tags:tags + 16]  # with its genuine tag
    path2.write_bytes(bytes(mixed))
    with pytest.raises(CorruptFile, match="chunk 0"):
        read(path2, header, len(payload))


def test_every_write_draws_a_fresh_nonce_so_no_one_time_key_tags_two_payloads(tmp_path):
    """Two files of the same entry (key, stamp, size) hold different nonces and so different tags,
    even for the same payload; the nonce is part of what the MAC checks."""
    payload = b"z" * (2 * CHUNK)
    path, header = write(tmp_path, payload)
    first = path.read_bytes()
    path, _ = write(tmp_path, payload)
    second = path.read_bytes()
    trailer = trailer_bytes(len(payload), CHUNK)
    assert first[:-trailer] == second[:-trailer]
    assert first[-trailer:-trailer + 16] != second[-trailer:-trailer + 16]  # nonces
    assert first[-32:] != second[-32:]  # tags
    changed = bytearray(second)
    changed[-trailer] ^= 1  # the nonce
    path.write_bytes(bytes(changed))
    with pytest.raises(CorruptFile, match="chunk 0"):
        read(path, header, len(payload))


def test_a_kv_disk_directory_swapped_for_a_link_keeps_the_links_files(tmp_path):
    """Whoever can rename the KV-disk directory cannot make tierd's wipe delete ``.kv`` files elsewhere: the
    wipe goes through the directory itself, never a link put in its place."""
    from ignis.tierd.disk import prepare_dir, wipe_dir

    kv = prepare_dir(tmp_path / "kv")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.kv").write_bytes(b"not tierd's")
    kv.rename(tmp_path / "kv-aside")
    (tmp_path / "kv").symlink_to(victim)
    assert "no longer a plain directory" in wipe_dir(tmp_path / "kv")
    assert (victim / "data.kv").read_bytes() == b"not tierd's"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_kv_disk_directory_or_key_file_of_another_user_is_refused(tmp_path):
    from ignis.shared.secret_file import load_secret
    from ignis.tierd.disk import ForeignFilesError, make_dir

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ForeignFilesError, match="owned by uid 65534"):
        make_dir(theirs)
    key = tmp_path / "key"
    key.write_bytes(bytes(32))
    key.chmod(0o600)
    os.chown(key, 65534, 65534)
    with pytest.raises(ValueError, match="owned by uid 65534"):
        load_secret(key, 32, "the KV-disk key file")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_kv_disk_directory_made_again_by_another_user_is_not_taken(tmp_path):
    import shutil

    from ignis.tierd.disk import MAC_KEY_BYTES, DiskTier, prepare_dir

    path = prepare_dir(tmp_path / "kv")
    tier = DiskTier(path, 1 << 20, bytes(MAC_KEY_BYTES), direct=False)
    shutil.rmtree(path)  # gone while serving, and another user makes it first
    path.mkdir(mode=0o777)
    os.chown(path, 65534, 65534)
    assert "made again by uid 65534" in tier.recreate()


def test_a_kv_disk_write_never_follows_a_link_planted_as_its_part_file(tmp_path):
    from ignis.tierd.disk import MAC_KEY_BYTES, encode_header, prepare_dir, write_entry

    kv = prepare_dir(tmp_path / "kv")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    key = "ab" * 16
    os.symlink(victim, kv / f"{key}.kv.part")
    with pytest.raises(OSError):
        write_entry(kv / f"{key}.kv", encode_header(key, "stamp", 4096, ("kv",), "s"), [bytes(4096)], 4096,
                    bytes(MAC_KEY_BYTES))
    assert victim.read_text() == "precious\n"


def test_a_wipe_at_exit_removes_the_directory_even_without_its_marker(tmp_path):
    from ignis.tierd.disk import MARKER, prepare_dir, wipe_dir

    kv = prepare_dir(tmp_path / "kv")
    (kv / MARKER).unlink()
    (kv / "x.kv").write_bytes(b"")
    assert wipe_dir(kv) == "" and not kv.exists()
