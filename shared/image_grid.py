"""The patch grid a picture is resized to before the vision tower sees it.

Pure arithmetic shared by the gateway (which resizes) and the engine (which
patchifies): given a picture's size and the tower's patch size, merge size and
pixel bounds, the target size is transformers' ``smart_resize`` for the
Qwen2-VL family (both sides multiples of ``patch_size * merge_size``, the area
within ``[min_pixels, max_pixels]``, the aspect ratio kept as near as rounding
allows). The grid counts patches; the number of ``<|image_pad|>`` tokens an
image takes in the prompt is the grid area over ``merge_size ** 2``.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class ImageGrid:
    """A resized picture's size in pixels and in patches."""

    height: int
    width: int
    grid_h: int
    grid_w: int
    merge_size: int

    @property
    def patches(self) -> int:
        """Patches the tower embeds (before merging)."""
        return self.grid_h * self.grid_w

    @property
    def tokens(self) -> int:
        """``<|image_pad|>`` tokens the image takes in the prompt (after merging)."""
        return self.patches // (self.merge_size * self.merge_size)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target ``(height, width)``, both multiples of ``factor``, area within the bounds.

    Equal to transformers' ``qwen2_vl.image_processing_qwen2_vl.smart_resize``
    (Python's ``round`` halves to even there too).
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if factor <= 0 or min_pixels < 0 or max_pixels <= 0 or min_pixels > max_pixels:
        raise ValueError(f"bad resize bounds: factor={factor} min_pixels={min_pixels} max_pixels={max_pixels}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid(
    height: int, width: int, patch_size: int, merge_size: int, min_pixels: int, max_pixels: int
) -> ImageGrid:
    """The resized size and patch grid of a ``height x width`` picture."""
    if patch_size <= 0 or merge_size <= 0:
        raise ValueError(f"patch_size and merge_size must be positive, got {patch_size} and {merge_size}")
    h, w = smart_resize(height, width, patch_size * merge_size, min_pixels, max_pixels)
    return ImageGrid(h, w, h // patch_size, w // patch_size, merge_size)


def grid_of_resized(height: int, width: int, patch_size: int, merge_size: int) -> ImageGrid:
    """The grid of a picture already resized; refuses a size off the patch grid."""
    factor = patch_size * merge_size
    if height <= 0 or width <= 0 or height % factor or width % factor:
        raise ValueError(f"a resized image must be a positive multiple of {factor} on each side, got {height}x{width}")
    return ImageGrid(height, width, height // patch_size, width // patch_size, merge_size)


DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280


def preprocessor_pixel_bounds(preprocessor: dict) -> tuple[object, object]:
    """(min, max) pixels of a parsed ``preprocessor_config.json``, as written (``size.shortest_edge`` /
    ``longest_edge``, else ``min_pixels`` / ``max_pixels``, else the processor's defaults); the
    caller checks them."""
    size = preprocessor.get("size") if isinstance(preprocessor.get("size"), dict) else {}
    return (size.get("shortest_edge", preprocessor.get("min_pixels", DEFAULT_MIN_PIXELS)),
            size.get("longest_edge", preprocessor.get("max_pixels", DEFAULT_MAX_PIXELS)))
