"""From a resized picture to the vision tower's input: normalised, flattened patches.

The gateway resizes a picture to the patch grid (``shared.image_grid``) and
sends raw RGB bytes (``shared.image_input.ImageInput``). Here they become what
transformers' Qwen2-VL image processor gives for the same resized picture:

    x = uint8 * (1/255)  (in float64, then float32)      rescale
    x = (x - mean) / std per channel  (float32)           normalise
    [C, H, W] -> [gh/m, gw/m, m, m, C, T, P, P] -> [gh*gw, C*T*P*P]

with ``P`` the patch size, ``m`` the spatial merge size and ``T`` the temporal
patch size (a still picture is repeated ``T`` times). Patches come out in
merge-block order: the ``m x m`` patches that merge into one prompt token are
consecutive, blocks in row-major order over the ``gh/m x gw/m`` block grid.
"""

from __future__ import annotations

import torch

from ignis.engine.models.vision_config import VisionConfig
from ignis.shared.image_grid import ImageGrid, grid_of_resized
from ignis.shared.image_input import ImageInput


def image_grid_of(image: ImageInput, cfg: VisionConfig) -> ImageGrid:
    """The patch grid of a resized picture; refuses one off the grid."""
    return grid_of_resized(image.height, image.width, cfg.patch_size, cfg.spatial_merge_size)


def normalised_pixels(image: ImageInput, cfg: VisionConfig) -> torch.Tensor:
    """[C, H, W] float32: rescaled to [0, 1] and normalised with the checkpoint's mean and std."""
    raw = torch.frombuffer(bytearray(image.pixels), dtype=torch.uint8).view(image.height, image.width, 3)
    x = (raw.permute(2, 0, 1).to(torch.float64) * (1 / 255)).to(torch.float32)
    mean = torch.tensor(cfg.image_mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(cfg.image_std, dtype=torch.float32).view(-1, 1, 1)
    return (x - mean) / std


def patchify(image: ImageInput, cfg: VisionConfig) -> tuple[torch.Tensor, ImageGrid]:
    """Flattened patches [grid_h * grid_w, patch_dim] float32 (merge-block order) and the grid."""
    grid = image_grid_of(image, cfg)
    x = normalised_pixels(image, cfg)
    c, p, m, t = cfg.in_channels, cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    x = x.reshape(c, grid.grid_h // m, m, p, grid.grid_w // m, m, p)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # [bh, bw, mh, mw, C, P, P]
    x = x.unsqueeze(5).expand(-1, -1, -1, -1, -1, t, -1, -1)
    return x.reshape(grid.patches, c * t * p * p).contiguous(), grid
