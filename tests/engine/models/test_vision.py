"""engine.models.vision and image_patches against transformers' Qwen3.5 vision model and image processor."""

import dataclasses

import pytest
import torch

from ignis.engine.models.image_patches import patchify
from ignis.engine.models.vision import VisionTower
from ignis.engine.models.vision_config import load_vision_config
from ignis.shared.image_input import ImageInput
from tests.engine.models.vision_reference import hf_processor, picture, resized_input, vlm_checkpoint

SIZES = [(16, 16), (24, 40), (56, 32)]  # multiples of patch 4 x merge 2: grids 4x4, 6x10, 14x8


def _tower(ckpt) -> VisionTower:
    vcfg = load_vision_config(ckpt.path)
    tower = VisionTower(vcfg)
    weights = {n.removeprefix("model.visual."): t for n, t in ckpt.model.state_dict().items()
               if n.startswith("model.visual.")}
    tower.load_state_dict(weights, strict=True)
    return tower.eval()


def test_patches_equal_the_processor(checkpoint_factory):
    ckpt = vlm_checkpoint(checkpoint_factory)
    vcfg = dataclasses.replace(load_vision_config(ckpt.path), image_mean=(0.5, 0.4, 0.3), image_std=(0.2, 0.3, 0.25))
    proc = hf_processor(vcfg)
    for i, (h, w) in enumerate(SIZES):
        px = picture(h, w, seed=i)
        ref = proc(images=[px], do_resize=False, return_tensors="pt")
        patches, grid = patchify(ImageInput.from_rgb(px.tobytes(), h, w), vcfg)
        assert ref["image_grid_thw"].tolist() == [[1, grid.grid_h, grid.grid_w]]
        assert torch.equal(patches, ref["pixel_values"].to(torch.float32))


def test_resize_then_patches_equal_the_processor(checkpoint_factory):
    ckpt = vlm_checkpoint(checkpoint_factory)
    vcfg = dataclasses.replace(load_vision_config(ckpt.path), min_pixels=8 * 8, max_pixels=48 * 48)
    proc = hf_processor(vcfg)
    for i, (h, w) in enumerate([(37, 21), (100, 61), (9, 9)]):
        px = picture(h, w, seed=10 + i)
        ref = proc(images=[px], return_tensors="pt")
        patches, grid = patchify(resized_input(vcfg, px), vcfg)
        assert ref["image_grid_thw"].tolist() == [[1, grid.grid_h, grid.grid_w]]
        assert torch.equal(patches, ref["pixel_values"].to(torch.float32))


def test_off_grid_picture_is_refused(checkpoint_factory):
    vcfg = load_vision_config(vlm_checkpoint(checkpoint_factory).path)
    with pytest.raises(ValueError):
        patchify(ImageInput.from_rgb(bytes(12 * 16 * 3), 12, 16), vcfg)


def _ours_and_transformers(ckpt, tower) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tower's embeddings of pictures of SIZES, and transformers' fp32 ones."""
    items = [patchify(ImageInput.from_rgb(picture(h, w, i).tobytes(), h, w), tower.cfg)
             for i, (h, w) in enumerate(SIZES)]
    got = tower([p for p, _ in items], [g for _, g in items])
    with torch.no_grad():
        thw = torch.tensor([[1, g.grid_h, g.grid_w] for _, g in items])
        ref = ckpt.model.model.get_image_features(torch.cat([p for p, _ in items]), thw).pooler_output
    assert len(got) == len(ref) == len(SIZES)
    return got, ref


def test_tower_equals_transformers(checkpoint_factory):
    ckpt = vlm_checkpoint(checkpoint_factory)
    got, ref = _ours_and_transformers(ckpt, _tower(ckpt))
    for a, b in zip(got, ref):
        assert a.shape == b.shape == (b.shape[0], 64)
        assert (a - b).norm() / b.norm() < 1e-5


def test_tower_in_bf16_stays_near_transformers_fp32(checkpoint_factory):
    """The tower as the GPU runs it (bf16 weights and activations; fp32 rotation and positions): bf16
    outputs within 3e-2 of transformers' fp32 tower (measured 6e-3)."""
    ckpt = vlm_checkpoint(checkpoint_factory)
    got, ref = _ours_and_transformers(ckpt, _tower(ckpt).to(torch.bfloat16))
    for a, b in zip(got, ref):
        assert a.dtype == torch.bfloat16 and bool(torch.isfinite(a).all())
        assert (a.float() - b).norm() / b.norm() < 3e-2


def test_mrope_tables_equal_the_plain_ones_on_text():
    from ignis.engine.models.layers import PartialRotary

    rot = PartialRotary(16, 10000.0)
    pos = torch.arange(50) * 7
    plain = rot.cos_sin(pos, torch.float32)
    mixed = rot.mrope_cos_sin(pos.expand(3, -1), (3, 3, 2), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(plain, mixed))
    h_only = torch.stack([pos, pos + 1, pos])
    cos, _ = rot.mrope_cos_sin(h_only, (3, 3, 2), torch.float32)
    changed = (cos != plain[0]).any(0).nonzero().flatten().tolist()
    assert changed == [1, 4, 7, 9, 12, 15]  # the h frequencies, in both halves


def test_engine_and_gateway_read_the_same_pad_and_grid_from_a_sparse_config(tmp_path):
    """A checkpoint whose config.json leaves out image_token_id and the patch sizes: both processes fall back
    alike (the tokenizer's <|image_pad|>, the preprocessor's sizes), or the prompt's pads would not be the
    ones the engine embeds pictures at."""
    import json

    from ignis.engine.models.vision_config import load_vision_config
    from ignis.gateway.vision_settings import read_vision_settings

    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"depth": 1}, "text_config": {}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14, "merge_size": 3}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}, "added_tokens": [
        {"id": 7001, "content": "<|vision_start|>"}, {"id": 7003, "content": "<|image_pad|>"}]}))
    engine = load_vision_config(tmp_path)
    gateway = read_vision_settings(tmp_path, 7003)  # what the gateway's tokenizer says <|image_pad|> is
    assert engine.image_token_id == gateway.image_token_id == 7003
    assert (engine.patch_size, engine.spatial_merge_size) == (gateway.patch_size, gateway.merge_size) == (14, 3)
