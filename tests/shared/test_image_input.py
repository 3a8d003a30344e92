"""shared.image_input: size checks and the content digest."""

import pytest

from ignis.shared.image_input import ImageInput, image_digest


def test_digest_depends_on_bytes_and_size():
    px = bytes(range(12)) * 2  # 2x4 RGB
    a = ImageInput.from_rgb(px, 2, 4)
    assert a.digest == image_digest(px, 2, 4)
    assert ImageInput.from_rgb(px, 4, 2).digest != a.digest
    other = bytearray(px)
    other[0] ^= 1
    assert ImageInput.from_rgb(bytes(other), 2, 4).digest != a.digest


@pytest.mark.parametrize("pixels,h,w", [(b"\0" * 11, 2, 2), (b"", 0, 4), (b"\0" * 12, -2, -2)])
def test_wrong_sizes_are_refused(pixels, h, w):
    with pytest.raises(ValueError):
        ImageInput.from_rgb(pixels, h, w)
