"""shared.image_grid: the resize target equals transformers' smart_resize."""

import itertools

import pytest

from ignis.shared.image_grid import grid_of_resized, image_grid, smart_resize


def test_equals_transformers_smart_resize():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference

    bounds = [(56 * 56, 28 * 28 * 1280, 28), (65536, 16777216, 32), (32 * 32, 64 * 64 * 4, 32), (4096, 20000, 32)]
    sizes = [1, 7, 31, 32, 33, 47, 48, 49, 100, 333, 512, 640, 1000, 1999, 4096]
    for (lo, hi, factor), (h, w) in itertools.product(bounds, itertools.product(sizes, sizes)):
        if max(h, w) / min(h, w) > 200:
            with pytest.raises(ValueError):
                smart_resize(h, w, factor, lo, hi)
            continue
        assert smart_resize(h, w, factor, lo, hi) == reference(h, w, factor=factor, min_pixels=lo, max_pixels=hi), (h, w)


def test_grid_and_tokens():
    g = image_grid(300, 500, patch_size=16, merge_size=2, min_pixels=32 * 32, max_pixels=1 << 24)
    assert (g.height, g.width) == (288, 512)
    assert (g.grid_h, g.grid_w) == (18, 32)
    assert g.patches == 18 * 32 and g.tokens == 9 * 16
    assert grid_of_resized(288, 512, 16, 2) == g


@pytest.mark.parametrize("h,w", [(0, 32), (33, 32), (32, 48)])
def test_off_grid_sizes_are_refused(h, w):
    with pytest.raises(ValueError):
        grid_of_resized(h, w, 16, 2)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        smart_resize(10, 10, 32, 100, 50)
    with pytest.raises(ValueError):
        image_grid(10, 10, 0, 2, 1, 100)
