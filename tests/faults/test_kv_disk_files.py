"""Fault: damaged, foreign and old KV-disk files. Each is refused before any byte reaches engine
memory, deleted, counted in ``ignis:tierd_checksum_failures_total{check}``, and the request that
wanted it is recomputed with the same greedy tokens as its cold run.

The damage matrix (``DAMAGES``) and the check each one fails:

    payload_flip     one byte of the payload flipped            checksum (the chunk's Poly1305 tag)
    header_flip      one byte of the header JSON flipped        header
    magic_flip       one byte of the "IGNISKV3" magic flipped   header
    truncated        the last 100 bytes cut                     size
    zero_length      an empty file                              size
    foreign_stamp    a whole, correctly MACed file of the same  header (another stamp: another model)
                     key written under another stamp
    foreign_install  the same header and payload MACed with     checksum
                     another install's key
    format_1         a file of format 1 ("IGNISKV1")            header ("format 1" in the message)
    format_2         a file of format 2 ("IGNISKV2", HMAC-      header ("format 2" in the message)
                     SHA256 per chunk)

Already covered elsewhere, not repeated here: the file-level checks of each
kind (tests/tierd/test_disk.py), a flipped and a truncated file against a
real tierd (tests/tierd/test_tierd_process.py::
test_corrupt_or_truncated_disk_file_answers_missing_and_tierd_keeps_serving),
a file forged with plain checksums
(test_a_disk_file_forged_with_nan_bytes_and_plain_checksums_is_refused), and a
truncated or tail-corrupted file under a real engine
(tests/engine/test_tiers_e2e.py::test_damaged_disk_file_is_a_miss_with_correct_output).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import orjson
import pytest

from ignis.shared.tier_wire import Missing, Restore, Restored, Welcome
from ignis.tierd.disk import MARKER, write_entry
from tests.engine.engine_process import EngineProcess
from tests.engine.test_tiers_e2e import fill_pool, prompt
from tests.tierd.fake_engine import STAMP, FakeEngine, TierdProcess, key
from tests.tierd.test_tierd_process import DST, demote, lookup


def _prefix(data: bytes) -> tuple[int, int]:
    """(header_len, chunk) of a KV-disk file's bytes."""
    _, header_len, chunk = struct.unpack_from("<8sII", data)
    return header_len, chunk


def _rewrite(path: Path, header: bytes, payload: bytes, chunk: int, mac_key: bytes) -> None:
    write_entry(path, header, [np.frombuffer(payload, dtype=np.uint8)], len(payload), mac_key, chunk)


def damage(path: Path, how: str, mac_key: bytes) -> str:
    """Damage the KV-disk file at ``path`` in the way ``how`` names; returns the check it must fail."""
    data = bytearray(path.read_bytes())
    header_len, chunk = _prefix(data)
    header = bytes(data[16:16 + header_len])
    nbytes = orjson.loads(header)["payload_bytes"]
    payload = bytes(data[16 + header_len:16 + header_len + nbytes])
    if how == "payload_flip":
        data[16 + header_len + nbytes // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return "checksum"
    if how == "header_flip":
        at = 16 + header.index(b'"stamp"') + 9  # a character inside the stamp's value
        data[at] ^= 0x01
        path.write_bytes(bytes(data))
        return "header"
    if how == "magic_flip":
        data[5] ^= 0x01
        path.write_bytes(bytes(data))
        return "header"
    if how == "truncated":
        path.write_bytes(bytes(data[:-100]))
        return "size"
    if how == "zero_length":
        path.write_bytes(b"")
        return "size"
    if how == "foreign_stamp":  # same key, same size: a genuine file of this install for another model
        stamp = _stamp_of(header)
        other = header.replace(b'"' + stamp + b'"', b'"' + _other_stamp(stamp) + b'"')
        assert other != header and len(other) == len(header)
        _rewrite(path, other, payload, chunk, mac_key)
        return "header"
    if how == "foreign_install":
        _rewrite(path, header, payload, chunk, bytes(range(1, 33)))
        return "checksum"
    if how in ("format_1", "format_2"):
        data[:8] = b"IGNISKV1" if how == "format_1" else b"IGNISKV2"
        path.write_bytes(bytes(data))
        return "header"
    raise ValueError(how)


def _stamp_of(header: bytes) -> bytes:
    return orjson.loads(header)["stamp"].encode()


def _other_stamp(stamp: bytes) -> bytes:
    """A stamp of the same length naming another model (its first hex digit changed)."""
    return (b"e" if stamp[:1] == b"f" else b"f") + stamp[1:]


DAMAGES = ("payload_flip", "header_flip", "magic_flip", "truncated", "zero_length", "foreign_stamp",
           "foreign_install", "format_1", "format_2")


@pytest.fixture(scope="module")
def tierd(tmp_path_factory):
    proc = TierdProcess(tmp_path_factory.mktemp("rt"), "--reuse-kv-host-pool-bytes", "1M")
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def engine(tierd):
    eng = FakeEngine(tierd.endpoint)
    assert isinstance(eng.hello(), Welcome)
    yield eng
    eng.close()


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_file_is_refused_before_use_deleted_and_counted(engine, tierd, how):
    n = 100 + DAMAGES.index(how)
    disk_dir = tierd.runtime_dir / "default-kv-disk"
    mac_key = (tierd.runtime_dir / "default-kv-disk.key").read_bytes()
    reply, _ = demote(engine, n, target="disk")
    assert reply.tier == "disk"
    path = disk_dir / f"{key(n)}.kv"
    check = damage(path, how, mac_key)
    engine.scramble()
    before = engine.snapshot()
    failed = tierd.metric("ignis:tierd_checksum_failures_total", check=check)
    corrupt = tierd.metric("ignis:tierd_missing_total", reason="corrupt")
    got = engine.ask(Restore(engine.next_req(), key(n), STAMP, DST))
    assert isinstance(got, Missing) and got.reason == "corrupt", got
    if how.startswith("format_"):
        assert how.replace("_", " ") in got.message
    assert engine.snapshot() == before  # refused before any byte reached engine memory
    assert not path.exists() and lookup(engine, n) == [None]
    assert sorted(os.listdir(disk_dir)) == [MARKER]
    assert tierd.metric("ignis:tierd_checksum_failures_total", check=check) == failed + 1
    assert tierd.metric("ignis:tierd_missing_total", reason="corrupt") == corrupt + 1
    again, want = demote(engine, n, target="disk")  # the key is usable again, and tierd serves on
    assert again.tier == "disk" and isinstance(engine.ask(Restore(engine.next_req(), key(n), STAMP, DST)),
                                               Restored)
    assert engine.read(DST) == want


ENGINE_DAMAGES = ("payload_flip", "header_flip", "zero_length", "foreign_stamp", "foreign_install", "format_1")
"""The damages tried under a real engine (truncation and a corrupted tail are in tests/engine/test_tiers_e2e.py)."""


def test_every_damage_under_a_real_engine_is_a_miss_recomputed_equal_to_cold(tmp_path):
    """One engine session: each prompt's entry goes to KV-disk, each file gets another damage, and
    each prompt asked again gives its cold tokens, with nothing restored from KV-disk."""
    rt = tmp_path / "rt"
    rt.mkdir()
    # an arena too small for an entry: retained entries go on to KV-disk
    tierd = TierdProcess(rt, "--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "64M")
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", "1024", "--decode-lanes", "2",
                        "--restore-floor-kv-disk", "64")
    disk_dir = rt / "default-kv-disk"
    try:
        prompts = [prompt(300, 500 + i) for i in range(len(ENGINE_DAMAGES))]
        cold = [eng.run(f"cold{i}", p, max_tokens=6, ignore_eos=True, opener_start=297).tokens
                for i, p in enumerate(prompts)]
        fill_pool(eng, "fill")
        files = sorted(disk_dir.glob("*.kv"))
        assert len(files) == len(prompts), (files, tierd.log_text()[-3000:])  # one entry per prompt
        mac_key = (rt / "default-kv-disk.key").read_bytes()
        checks = [damage(f, how, mac_key) for f, how in zip(files, ENGINE_DAMAGES)]
        for i, p in enumerate(prompts):
            again = eng.run(f"again{i}", p, max_tokens=6, ignore_eos=True, opener_start=297)
            assert again.finished.finish_reason == "length" and again.finished.reuse.tier != "kv_disk"
            assert again.tokens == cold[i], i
        assert eng.stats()["reuse_restores_total"] == 0
        # each prompt's restore read its damaged file once, was refused, and the refusal was counted
        for check in set(checks):
            assert tierd.metric("ignis:tierd_checksum_failures_total", check=check) == checks.count(check), check
        assert tierd.metric("ignis:tierd_missing_total", reason="corrupt") == len(prompts)
    finally:
        assert eng.stop() == 0
        assert tierd.stop() == 0
