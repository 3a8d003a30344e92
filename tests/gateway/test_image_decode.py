"""gateway.image_decode and gateway.image_sources: formats, limits, and transformers' resize."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from ignis.gateway.image_decode import ImageError, decode_image, set_source_limit
from ignis.gateway.image_sources import data_url_bytes
from ignis.gateway.vision_settings import VisionSettings
from tests.gateway.image_samples import data_url, encoded, picture

SETTINGS = VisionSettings(patch_size=16, merge_size=2, image_token_id=248056, min_pixels=32 * 32,
                          max_pixels=32 * 32 * 16)
BIG = 1 << 24
set_source_limit(BIG)  # what the gateway sets at start (--max-image-source-pixels)


def _transformers_resized(image: Image.Image, settings: VisionSettings) -> np.ndarray:
    """The picture transformers' Qwen2-VL image processor (PIL backend) resizes to, before rescaling."""
    from transformers.image_transforms import convert_to_rgb, resize
    from transformers.image_utils import ChannelDimension, PILImageResampling
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    rgb = convert_to_rgb(image, return_numpy=True)
    h, w = smart_resize(rgb.shape[0], rgb.shape[1], factor=settings.patch_size * settings.merge_size,
                        min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
    return resize(rgb, (h, w), resample=PILImageResampling.BICUBIC, data_format=ChannelDimension.LAST,
                  input_data_format=ChannelDimension.LAST)


@pytest.mark.parametrize("size", [(50, 37), (200, 90), (7, 300), (64, 64)])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_resize_equals_transformers(size, mode):
    image = picture(*size, seed=size[0], mode="RGBA" if mode == "RGBA" else "RGB")
    if mode in ("L", "P"):
        image = image.convert(mode)
    got = decode_image(encoded(image), SETTINGS, BIG)
    want = _transformers_resized(Image.open(io.BytesIO(encoded(image))), SETTINGS)
    assert (got.height, got.width) == want.shape[:2]
    assert got.height % 32 == 0 and got.width % 32 == 0
    assert np.array_equal(np.frombuffer(got.pixels, np.uint8).reshape(want.shape), want.astype(np.uint8))


@pytest.mark.parametrize("fmt,save", [("PNG", {}), ("JPEG", {"quality": 90}), ("WEBP", {"lossless": True}),
                                      ("GIF", {})])
def test_the_four_formats_decode(fmt, save):
    image = picture(64, 48, seed=3)
    got = decode_image(encoded(image, fmt, **save), SETTINGS, BIG)
    assert (got.height, got.width) == (64, 64)  # 48 x 64 rounds to the 32-pixel grid
    if fmt in ("PNG", "WEBP"):  # lossless: the very same pixels
        assert got == decode_image(encoded(image), SETTINGS, BIG)


def test_an_animated_gif_gives_its_first_frame():
    frames = [picture(32, 32, seed=s).convert("P") for s in (1, 2, 3)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    first = decode_image(encoded(frames[0], "GIF"), SETTINGS, BIG)
    assert decode_image(buf.getvalue(), SETTINGS, BIG) == first


def test_the_same_picture_has_the_same_digest_and_another_does_not():
    a = decode_image(encoded(picture(40, 40, seed=1)), SETTINGS, BIG)
    assert decode_image(encoded(picture(40, 40, seed=1)), SETTINGS, BIG).digest == a.digest
    b = decode_image(encoded(picture(40, 40, seed=2)), SETTINGS, BIG)
    assert (b.height, b.width) == (a.height, a.width) and b.digest != a.digest


@pytest.mark.parametrize("data,match", [
    (b"not an image at all", "not a PNG, JPEG, WebP or GIF image"),
    (encoded(picture(16, 16), "BMP"), "not a PNG, JPEG, WebP or GIF image"),
    (encoded(picture(64, 64))[:60], "corrupt"),
    (encoded(picture(500, 2)), "aspect ratio"),
])
def test_bad_images_are_image_errors(data, match):
    with pytest.raises(ImageError, match=match):
        decode_image(data, SETTINGS, BIG)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_picture_over_the_source_limit_is_refused_before_decoding():
    # PNGs that claim many pixels in a few kilobytes: decompression bombs
    big = encoded(Image.new("L", (4500, 4500)), optimize=True)
    assert len(big) < 1 << 20
    with pytest.raises(ImageError, match="4500x4500 pixels, more than the 16777216 accepted"):
        decode_image(big, SETTINGS, 1 << 24)
    with pytest.raises(ImageError, match="decompression bomb"):  # past Pillow's own limit, set explicitly
        decode_image(encoded(Image.new("L", (20000, 20000)), optimize=True), SETTINGS, 1 << 30)
    with pytest.raises(ImageError, match="more than the 1000 accepted"):
        decode_image(encoded(picture(40, 40)), SETTINGS, 1000)


@pytest.mark.parametrize("url,match", [
    ("data:image/png;base64,@@@@", "base64 is corrupt"),
    ("data:image/png;base64,iVBORw0KGgo", "base64 is corrupt"),
    ("data:text/plain;base64,aGVsbG8=", "not an image"),
    ("data:image/png,rawbytes", "must be base64"),
    ("data:image/png;base64", "no ','"),
    ("data:image/png;base64,", "no data"),
])
def test_bad_data_urls(url, match):
    with pytest.raises(ImageError, match=match):
        data_url_bytes(url, 1 << 20)


def test_a_data_url_over_the_byte_limit_is_refused_unread():
    with pytest.raises(ImageError, match="over 1024 bytes"):
        data_url_bytes(data_url(bytes(4096)), 1024)
    assert data_url_bytes(data_url(b"\x89PNG"), 1024) == b"\x89PNG"
