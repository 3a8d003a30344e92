"""gateway.image_limits, gateway.vision_settings and gateway.prompt_images: flags, checkpoint files, expansion."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.config import GatewayConfig
from ignis.gateway.errors import ApiError
from ignis.gateway.image_limits import DEFAULT_IMAGES_PER_PROMPT, parse_mm_limit
from ignis.gateway.prompt_images import check_image_count, expand_placeholders
from ignis.gateway.vision_settings import VisionSettings, read_vision_settings
from ignis.shared.image_input import ImageInput

VISION = VisionSettings(patch_size=16, merge_size=2, image_token_id=9, min_pixels=1024, max_pixels=16384)


@pytest.mark.parametrize("text,count", [(None, DEFAULT_IMAGES_PER_PROMPT), ("4", 4), (7, 7), ('{"image": 2}', 2),
                                        ('{"image": 0, "video": 0}', 0), ("{}", DEFAULT_IMAGES_PER_PROMPT)])
def test_mm_limit_forms(text, count):
    assert parse_mm_limit(text) == count


@pytest.mark.parametrize("text,words", [("four", "takes JSON"), ('{"audio": 1}', "'audio' is not served"),
                                        ('{"video": 1}', "video inputs are not supported yet"),
                                        ("-1", "integer in"), ('{"image": 1.5}', "integer in"), ("9999", "integer in")])
def test_bad_mm_limits(text, words):
    with pytest.raises(ValueError, match=words):
        parse_mm_limit(text)
    with pytest.raises(ValueError):
        GatewayConfig(limit_mm_per_prompt=text)


@pytest.mark.parametrize("kwargs", [dict(min_image_pixels=0), dict(min_image_pixels=10, max_image_pixels=5),
                                    dict(max_image_bytes=10), dict(media_fetch_timeout=0),
                                    dict(allowed_media_domains=("https://x.com",))])
def test_bad_image_flags(kwargs):
    with pytest.raises(ValueError):
        GatewayConfig(**kwargs)


def test_settings_come_from_the_checkpoint_files(tmp_path):
    assert read_vision_settings(tmp_path, 5) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {}}))
    assert read_vision_settings(tmp_path, 5) is None  # text-only
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"patch_size": [14, 14],
                                                                        "spatial_merge_size": 2}}))
    s = read_vision_settings(tmp_path, 5)
    assert (s.patch_size, s.merge_size, s.image_token_id) == (14, 2, 5)
    assert (s.min_pixels, s.max_pixels) == (56 * 56, 28 * 28 * 1280)  # transformers' defaults
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 100,
                                                                            "longest_edge": 900}}))
    s = read_vision_settings(tmp_path, 5)
    assert (s.min_pixels, s.max_pixels) == (100, 900)
    assert s.bounded(None, 4000).max_pixels == 4000 and s.bounded(200, None).min_pixels == 200
    with pytest.raises(ValueError):
        s.bounded(5000, None)


def _image(h: int, w: int) -> ImageInput:
    return ImageInput.from_rgb(bytes(h * w * 3), h, w)


def test_expansion_repeats_pads_and_moves_marks():
    ids = [1, 2, 9, 3, 9, 4, 5]
    marks = {"system_end": 1, "opener_start": 5, "part_end": 3, "last_is_user": True, "mark_missing": None}
    out, moved = expand_placeholders(ids, (_image(64, 96), _image(32, 32)), VISION, marks)
    assert out == [1, 2] + [9] * 6 + [3, 9, 4, 5]
    assert moved == {"system_end": 1, "opener_start": 10, "part_end": 8, "last_is_user": True, "mark_missing": None}
    assert out[moved["opener_start"]] == ids[5] and out[moved["part_end"]] == ids[3]


def test_pads_that_do_not_match_the_images_are_400():
    with pytest.raises(ApiError, match="2 image placeholders for 1 images"):
        expand_placeholders([9, 9], (_image(32, 32),), VISION, {})


def test_image_count_checks():
    check_image_count(0, None, 0)
    with pytest.raises(ApiError, match="takes no images"):
        check_image_count(1, None, 4)
    with pytest.raises(ApiError, match="at most 2 allowed"):
        check_image_count(3, VISION, 2)
