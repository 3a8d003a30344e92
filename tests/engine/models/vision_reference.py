"""Helpers for the vision tests: a tiny VLM checkpoint, pictures, and transformers' preprocessing of them."""

from __future__ import annotations

import numpy as np

from ignis.shared.image_input import ImageInput
from tests.engine.checkpoints import TINY_VLM_ROPE


def vlm_checkpoint(checkpoint_factory, **kwargs):
    """The tiny Qwen3_5ForConditionalGeneration with image tokens in its vocabulary and full mRoPE sections."""
    return checkpoint_factory("qwen3_5", multimodal=True, vlm_tokens=True, config_overrides=TINY_VLM_ROPE,
                              **kwargs)


def picture(height: int, width: int, seed: int) -> np.ndarray:
    """A random RGB picture [H, W, 3] uint8."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def hf_processor(vcfg):
    """transformers' image processor for this family, set up like the engine's vision config."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=vcfg.patch_size, temporal_patch_size=vcfg.temporal_patch_size,
        merge_size=vcfg.spatial_merge_size, image_mean=list(vcfg.image_mean), image_std=list(vcfg.image_std),
        size={"shortest_edge": vcfg.min_pixels, "longest_edge": vcfg.max_pixels})


def resized_input(vcfg, pixels: np.ndarray) -> ImageInput:
    """The picture resized as transformers' processor resizes it (PIL bicubic to the smart_resize size)."""
    from PIL import Image

    from ignis.shared.image_grid import image_grid

    h, w = pixels.shape[:2]
    g = image_grid(h, w, vcfg.patch_size, vcfg.spatial_merge_size, vcfg.min_pixels, vcfg.max_pixels)
    img = Image.fromarray(pixels).resize((g.width, g.height), resample=Image.BICUBIC)
    return ImageInput.from_rgb(np.asarray(img).tobytes(), g.height, g.width)
