"""The one codec under both protocols: separate types and versions, strict declared types, self-packing classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import orjson
import pytest

from ignis.shared import tier_wire, wire
from ignis.shared.wire_codec import ErrorReply, WireProtocol, protocol_of
from ignis.shared.wire_fields import TokenFrame, WireError
from ignis.shared.wire_values import dataclass_from_json, from_json, to_json

K1 = "0123456789abcdef"


def test_each_protocol_decodes_only_its_own_types():
    drop = tier_wire.encode(tier_wire.Drop(1, K1))
    with pytest.raises(WireError, match="unknown message type 'tier_drop'"):
        wire.decode(drop)
    abort = wire.encode(wire.Abort("r1"))
    with pytest.raises(WireError, match="unknown message type 'abort'"):
        tier_wire.decode(abort)
    with pytest.raises(WireError, match="not a wire message of the engine-tierd protocol"):
        tier_wire.encode(wire.Abort("r1"))


def test_shared_types_belong_to_both_protocols():
    for msg in (ErrorReply("x"), wire.Stats(), wire.StatsReply({"a": 1})):
        assert tier_wire.decode(wire.encode(msg)) == msg
        assert wire.decode(tier_wire.encode(msg)) == msg
    assert wire.ErrorReply is tier_wire.ErrorReply is ErrorReply


def test_a_channel_finds_the_protocol_of_its_accepted_types():
    assert protocol_of(wire.GATEWAY_TO_ENGINE) is wire.GATEWAY_ENGINE
    assert protocol_of(wire.ENGINE_TO_GATEWAY) is wire.GATEWAY_ENGINE
    assert protocol_of(tier_wire.ENGINE_TO_TIERD) is tier_wire.ENGINE_TIERD
    assert protocol_of(tier_wire.TIERD_TO_ENGINE) is tier_wire.ENGINE_TIERD
    with pytest.raises(ValueError, match="2 protocols"):
        protocol_of((ErrorReply, wire.Stats))
    with pytest.raises(ValueError, match="0 protocols"):
        protocol_of((wire.Abort, tier_wire.Drop))


@dataclass(frozen=True)
class Probe:
    TYPE: ClassVar[str] = "probe"

    n: int
    ids: TokenFrame
    pair: tuple[str, int]
    note: str | None = None


def test_a_protocol_has_its_own_version_and_registry():
    proto = WireProtocol("test-probe", version=7)
    proto.add(Probe)
    assert Probe.FRAMES == 1
    msg = Probe(3, (1, 2), ("a", 4))
    frames = proto.encode(msg)
    assert orjson.loads(frames[0]) == {"type": "probe", "v": 7, "n": 3, "pair": ["a", 4], "note": None}
    assert frames[1] == b"\x01\x00\x00\x00\x02\x00\x00\x00"
    assert proto.decode(frames) == msg
    with pytest.raises(WireError, match="protocol version 7, this side speaks 1"):
        wire.decode(frames)
    with pytest.raises(WireError, match="protocol version 1, this side speaks 7"):
        proto.decode(wire.encode(ErrorReply("x")))


def test_type_names_are_unique_within_a_protocol():
    proto = WireProtocol("test-twice", version=1)

    @dataclass(frozen=True)
    class Other:
        TYPE: ClassVar[str] = "error"
        message: str

    with pytest.raises(ValueError, match="registered twice"):
        proto.add(Other)


def test_a_self_packing_class_must_say_how():
    @dataclass(frozen=True)
    class HalfDone:
        TYPE: ClassVar[str] = "half_done"
        n: int

        def to_wire(self):
            return {"n": self.n}, []

    with pytest.raises(TypeError, match="FRAMES, to_wire and from_wire"):
        WireProtocol("test-half", version=1).add(HalfDone)


@pytest.mark.parametrize("kind, value, match", [
    (int, True, "must be an integer, got bool"),
    (int, 1.0, "must be an integer, got float"),
    (float, False, "must be a number, got bool"),
    (float, "1", "must be a number, got str"),
    (bool, 0, "must be true or false"),
    (str, None, "must be a string, got NoneType"),
    (tuple[int, ...], (1, 2), "must be a list, got tuple"),
    (tuple[int, ...], [1, "2"], r"x\[1\] must be an integer"),
    (tuple[str, int], ["a"], r"must be a \[str, int\] pair, got 1 values"),
    (dict, [], "must be a dict"),
    (int | None, "1", "must be an integer"),
])
def test_declared_types_are_strict(kind, value, match):
    with pytest.raises((TypeError, ValueError), match=match):
        from_json(kind, value, "x")


def test_values_round_trip_through_json():
    probe = Probe(3, (1, 2), ("a", 4), note="n")
    assert to_json(probe) == {"n": 3, "ids": [1, 2], "pair": ["a", 4], "note": "n"}
    assert dataclass_from_json(Probe, to_json(probe)) == probe
    assert from_json(int | None, None, "x") is None and from_json(float, 2, "x") == 2
    with pytest.raises(ValueError, match=r"probe: unknown field 'extra'"):
        dataclass_from_json(Probe, {**to_json(probe), "extra": 1}, "probe")
    with pytest.raises(ValueError, match=r"probe: missing fields 'n', 'note'"):
        dataclass_from_json(Probe, {"ids": [], "pair": ["a", 1]}, "probe")
