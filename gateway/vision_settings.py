"""What the gateway needs of a checkpoint's vision side to turn an image into prompt tokens.

Read from the checkpoint directory: ``config.json``'s ``vision_config``
(``patch_size``, ``spatial_merge_size``) and its top-level ``image_token_id``
(``<|image_pad|>``), and ``preprocessor_config.json``'s pixel bounds
(``size.shortest_edge`` / ``size.longest_edge``, or the older ``min_pixels`` /
``max_pixels``; transformers' Qwen2-VL image processor defaults without them).
A checkpoint with no ``vision_config`` (a text-only model, Qwen3-Next) has no
settings: the gateway answers its images with 400. ``--min-image-pixels`` and
``--max-image-pixels`` replace the checkpoint's bounds. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ignis.shared.image_grid import ImageGrid, image_grid, preprocessor_pixel_bounds
from ignis.shared.tokenizer_files import TokenizerFilesError, read_json_object


@dataclass(frozen=True)
class VisionSettings:
    patch_size: int
    merge_size: int
    image_token_id: int
    min_pixels: int
    max_pixels: int

    def grid(self, height: int, width: int) -> ImageGrid:
        """The size a ``height x width`` picture is resized to, and its patch grid."""
        return image_grid(height, width, self.patch_size, self.merge_size, self.min_pixels, self.max_pixels)

    def bounded(self, min_pixels: int | None, max_pixels: int | None) -> VisionSettings:
        """These settings with the pixel bounds the flags set (None keeps the checkpoint's)."""
        lo = self.min_pixels if min_pixels is None else min_pixels
        hi = self.max_pixels if max_pixels is None else max_pixels
        if lo > hi:
            raise ValueError(f"image pixel bounds: the minimum {lo} exceeds the maximum {hi}")
        return replace(self, min_pixels=lo, max_pixels=hi)


def _positive(value: object, name: str) -> int:
    if isinstance(value, list) and value and all(v == value[0] for v in value):
        value = value[0]  # a square patch written as [p, p]
    if type(value) is not int or value < 1:
        raise TokenizerFilesError(f"config.json: vision {name} must be a positive integer, got {value!r}")
    return value


def vision_settings_from(config: dict, preprocessor: dict, pad_token_id: int | None) -> VisionSettings | None:
    """The settings of parsed ``config.json`` and ``preprocessor_config.json`` (None: text-only)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    image_token_id = config.get("image_token_id", pad_token_id)
    if type(image_token_id) is not int or image_token_id < 0:
        raise TokenizerFilesError("config.json: a vision checkpoint needs image_token_id (or an <|image_pad|> token)")
    lo, hi = preprocessor_pixel_bounds(preprocessor)
    settings = VisionSettings(
        patch_size=_positive(vision.get("patch_size", preprocessor.get("patch_size", 16)), "patch_size"),
        merge_size=_positive(vision.get("spatial_merge_size", preprocessor.get("merge_size", 2)), "spatial_merge_size"),
        image_token_id=image_token_id,
        min_pixels=_positive(lo, "min_pixels"),
        max_pixels=_positive(hi, "max_pixels"),
    )
    if settings.min_pixels > settings.max_pixels:
        raise TokenizerFilesError(f"preprocessor_config.json: min pixels {lo} exceed max pixels {hi}")
    return settings


def read_vision_settings(model_dir: str | Path, pad_token_id: int | None) -> VisionSettings | None:
    """The vision settings of a checkpoint directory (None: no vision side, or no config.json)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        return None
    config = read_json_object(model_dir / "config.json")
    pre_path = model_dir / "preprocessor_config.json"
    preprocessor = read_json_object(pre_path) if pre_path.is_file() else {}
    return vision_settings_from(config, preprocessor, pad_token_id)
