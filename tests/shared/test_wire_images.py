"""shared.wire_images: a Generate's images travel as raw frames, checked on the way in."""

from __future__ import annotations

import orjson
import pytest

from ignis.shared.image_input import ImageInput
from ignis.shared.wire import Generate, SamplingParams, WireError, decode, encode

RED = ImageInput.from_rgb(bytes([255, 0, 0]) * 6, 2, 3)
GREY = ImageInput.from_rgb(bytes(range(48)), 4, 4)


def _gen(images=()) -> Generate:
    return Generate(id="r1", prompt_ids=(1, 2, 3), sampling=SamplingParams(), images=images)


def test_images_round_trip_as_their_own_frames():
    msg = _gen((RED, GREY))
    frames = encode(msg)
    assert len(frames) == 2 + 2  # header, prompt ids, one frame per image
    assert frames[2] == RED.pixels and frames[3] == GREY.pixels
    header = orjson.loads(frames[0])
    assert header["images"] == [[2, 3, RED.digest.hex()], [4, 4, GREY.digest.hex()]]
    back = decode(frames)
    assert back == msg and back.images == (RED, GREY)


def test_no_images_leaves_the_field_out():
    frames = encode(_gen())
    assert len(frames) == 2 and "images" not in orjson.loads(frames[0])
    assert decode(frames).images == ()


def _tampered(edit) -> list:
    frames = encode(_gen((RED,)))
    header = orjson.loads(frames[0])
    edit(header, frames)
    frames[0] = orjson.dumps(header)
    return frames


@pytest.mark.parametrize("edit,match", [
    (lambda h, f: f.pop(), "frames, expected"),  # an entry without its frame
    (lambda h, f: f.append(b"\0" * 18), "frames, expected"),  # a frame without an entry
    (lambda h, f: f.__setitem__(2, b"\0" * 17), "bytes, a 2x3 RGB picture is 18"),
    (lambda h, f: f.__setitem__(2, b"\0" * 18), "digest does not match"),
    (lambda h, f: h["images"][0].__setitem__(0, 0), "height must be an integer"),
    (lambda h, f: h["images"][0].__setitem__(1, True), "width must be an integer"),
    (lambda h, f: h["images"][0].__setitem__(2, "zz" * 16), "not hex"),
    (lambda h, f: h["images"][0].__setitem__(2, "ab"), "hex digits"),
    (lambda h, f: h.__setitem__("images", [[2, 3]]), "entry"),
    (lambda h, f: h.__setitem__("images", {"a": 1}), "frames, expected|list of at most"),
    (lambda h, f: h["images"][0].__setitem__(0, 1 << 20), "height must be"),
])
def test_garbage_images_raise_wire_error(edit, match):
    with pytest.raises(WireError, match=match):
        decode(_tampered(edit))


def test_an_empty_image_list_is_not_sent():
    frames = encode(_gen())
    header = orjson.loads(frames[0])
    header["images"] = []
    with pytest.raises(WireError, match="only when it holds images"):
        decode([orjson.dumps(header), frames[1]])


def test_a_generate_refuses_non_images():
    with pytest.raises(TypeError, match="ImageInput"):
        _gen((b"\0" * 12,))
