"""The engine <-> tierd messages: every type round-trips, and malformed input only ever raises WireError."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.shared.tier_wire import (
    ENGINE_TO_TIERD,
    TIER_PROTOCOL_VERSION,
    TIERD_TO_ENGINE,
    BlockDesc,
    Bye,
    Demote,
    Demoted,
    Detached,
    Drop,
    Dropped,
    ErrorReply,
    Hello,
    Lookup,
    LookupReply,
    Missing,
    Restore,
    Restored,
    Stats,
    StatsReply,
    TierRefused,
    UnitLayout,
    Welcome,
    WireError,
    decode,
    encode,
)

K1, K2 = "0123456789abcdef", "f" * 64
KV = BlockDesc("kv", "shm", "ignis-default-kv-1-ab", runs=32, items=1000, item_bytes=131072,
               run_stride_bytes=1000 * 131072)
SSM = BlockDesc("ssm", "shm", "ignis-default-ssm-1-ab", 48, 16, 4 << 20, 16 * (4 << 20))
CONV = BlockDesc("conv", "cuda_ipc", "00ff" * 32, 48, 16, 60000, 16 * 60000 + 64, device=3)
SLOTS = BlockDesc("host_slots", "shm", "ignis-default-host_slots-1-ab", 1, 32, 150_000_000, 32 * 150_000_000)
HELLO = Hello(1, TIER_PROTOCOL_VERSION, "hash/bf16/nodrafter", "qwen3_5", 131072 * 32, (KV, SSM, CONV, SLOTS),
              UnitLayout())

MESSAGES = [
    HELLO,
    Hello(2, 1, "s", "qwen3_next", 4096, (KV,), UnitLayout(pages="kv", lane=(), image=None), engine_id="node-3"),
    Demote(3, K1, "s", (("kv", 0), ("kv", 999), ("ssm", 3), ("conv", 3))),
    Demote(4, K2, "s", (("host_slots", 31),), target="disk", kind="live", request_class="agent",
           last_used=1.7e9),
    Restore(5, K1, "s", (("kv", 5), ("ssm", 0), ("conv", 0))),
    Drop(6, K1),
    Lookup(7, "s", (K1, K2)),
    Lookup(8, "s", ()),
    Bye(9),
    Stats(),
    Welcome(1, 1, 2 << 30, 512, 4 << 20, 2 << 30, 0),
    Demoted(3, K1, "ram", 123),
    Restored(5, K1, "disk", 123),
    Missing(5, K1, "corrupt", "KV-disk file fails its checksum"),
    Dropped(6, K1, True),
    LookupReply(7, (K1, K2), ("ram", None), (123, 0)),
    Detached(9, 12),
    TierRefused(1, "hello", "", "busy", "this tierd serves engine 'default'"),
    TierRefused(3, "demote", K1, "no_room", "every tier is full of live work"),
    TierRefused(1, "hello", "", "protocol", "the engine speaks 2"),
    StatsReply({"arena_bytes": 1}),
    ErrorReply("header frame is not JSON"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frames = encode(msg)
    assert len(frames) == 1
    assert decode(frames) == msg
    header = orjson.loads(frames[0])
    assert header["v"] == 1 and "type" in header


def test_every_type_is_covered_and_split_by_direction():
    assert {type(m) for m in MESSAGES} == set(ENGINE_TO_TIERD) | set(TIERD_TO_ENGINE)
    assert not set(ENGINE_TO_TIERD) & set(TIERD_TO_ENGINE)
    with pytest.raises(WireError, match="not accepted"):
        decode(encode(Demoted(1, K1, "ram", 1)), ENGINE_TO_TIERD)


def test_block_descriptor_layout_arithmetic():
    assert KV.item_total == 32 * 131072 and KV.span_bytes == 32 * 1000 * 131072
    assert CONV.span_bytes == 47 * (16 * 60000 + 64) + 16 * 60000
    with pytest.raises(ValueError, match="runs would overlap"):
        BlockDesc("kv", "shm", "x", 2, 10, 8, 79)


@pytest.mark.parametrize("build,match", [
    (lambda: Demote(1, "ABCDEF0123456789", "s", (("kv", 0),)), "lowercase hex"),
    (lambda: Demote(1, K1, "s", ()), "at least one item"),
    (lambda: Demote(1, K1, "s", (("kv", -1),)), "item"),
    (lambda: Demote(1, K1, "s", (("kv", 0),), target="vram"), "target"),
    (lambda: Demote(1, K1, "s", (("kv", 0),), kind="pinned"), "kind"),
    (lambda: Demote(1, K1, "", (("kv", 0),)), "stamp"),
    (lambda: Demote(1, K1, "s", (("kv", 0),), last_used=float("nan")), "NaN"),
    (lambda: Restore(-1, K1, "s", (("kv", 0),)), "req"),
    (lambda: Hello(1, 1, "s", "llama", 4096, (KV,), UnitLayout()), "family"),
    (lambda: Hello(1, 1, "s", "qwen3_5", 4096, (KV,), UnitLayout()), "not among the blocks"),
    (lambda: Hello(1, 1, "s", "qwen3_5", 4096, (KV, KV), UnitLayout(lane=(), image=None)), "repeat"),
    (lambda: Hello(1, 1, "s", "qwen3_5", 100, (KV,), UnitLayout(lane=(), image=None)), "block_bytes"),
    (lambda: UnitLayout(pages="kv", lane=("kv",), image=None), "twice"),
    (lambda: BlockDesc("KV", "shm", "x", 1, 1, 1, 1), "block name"),
    (lambda: BlockDesc("kv", "cuda_ipc", "xyz", 1, 1, 1, 1), "hex"),
    (lambda: BlockDesc("kv", "shm", "/etc/passwd", 1, 1, 1, 1), "shared-memory name"),
    (lambda: BlockDesc("kv", "cuda_ipc", "ab" * 64, 1, 1, 1, 1, device=-1), "device"),
    (lambda: BlockDesc("kv", "cuda_ipc", "ab" * 64, 1, 1, 1, 1, device=True), "device"),
    (lambda: LookupReply(1, (K1,), (), ()), "parallel"),
    (lambda: TierRefused(1, "demote", K1, "tired", "m"), "reason"),
])
def test_senders_cannot_build_malformed_messages(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def _header(msg) -> dict:
    return orjson.loads(encode(msg)[0])


@pytest.mark.parametrize("mutate,match", [
    (lambda h: h.update(v=2), "protocol version 2"),
    (lambda h: h.pop("req"), "missing field 'req'"),
    (lambda h: h.update(extra=1), "unknown field"),
    (lambda h: h.update(source=[["kv", 1, 2]]), "pair"),
    (lambda h: h.update(source=[["kv", True]]), "integer"),
    (lambda h: h.update(source="kv"), "list"),
    (lambda h: h.update(key="../../etc"), "hex"),
    (lambda h: h.update(last_used="yesterday"), "number"),
])
def test_malformed_demote_headers_raise_wire_error(mutate, match):
    h = _header(MESSAGES[2])
    mutate(h)
    with pytest.raises(WireError, match=match):
        decode([orjson.dumps(h)])


@pytest.mark.parametrize("mutate,match", [
    (lambda h: h["blocks"][0].pop("handle"), r"blocks\[0\]: missing field 'handle'"),
    (lambda h: h["blocks"][0].update(runs=0), "runs"),
    (lambda h: h.update(blocks={}), "list"),
    (lambda h: h["unit"].update(pages="nope"), "not among the blocks"),
    (lambda h: h.pop("unit"), "missing field"),
])
def test_malformed_hello_headers_raise_wire_error(mutate, match):
    h = _header(HELLO)
    mutate(h)
    with pytest.raises(WireError, match=match):
        decode([orjson.dumps(h)])


def test_extra_frames_are_refused():
    with pytest.raises(WireError, match="expected 1"):
        decode([*encode(Drop(1, K1)), b"\0"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MESSAGES[:9]), st.text(max_size=12), json_values)
def test_random_field_values_only_raise_wire_error(msg, field, value):
    h = _header(msg)
    name = field if field in h or not h else sorted(h)[len(field) % len(h)]
    if name in ("type", "v"):
        return
    h[name] = value
    try:
        frame = orjson.dumps(h)
    except (TypeError, orjson.JSONEncodeError):
        return
    try:
        decode([frame])
    except WireError:
        pass
