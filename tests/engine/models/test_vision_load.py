"""Loading the vision tower: VLM layout, sharded or not, checked names and shapes, and the stamp."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ignis.engine.models.config import CheckpointError
from ignis.engine.models.loader import load_checkpoint
from tests.engine.models.vision_reference import vlm_checkpoint


def _reference(ckpt) -> dict:
    return {n.removeprefix("model.visual."): t for n, t in ckpt.model.state_dict().items()
            if n.startswith("model.visual.")}


@pytest.mark.parametrize("shard", [None, "60KB"])
def test_vision_tensors_loaded(checkpoint_factory, shard):
    ckpt = vlm_checkpoint(checkpoint_factory, max_shard_size=shard)
    loaded = load_checkpoint(ckpt.path)
    ref = _reference(ckpt)
    assert loaded.vision is not None and loaded.vision.image_token_id == 120
    assert loaded.vision.mrope_section == (3, 3, 2)
    assert sorted(loaded.vision_tensors) == sorted(ref)
    for name, t in ref.items():
        assert torch.equal(loaded.vision_tensors[name], t), name


def test_text_only_checkpoint_has_no_tower(qwen35_checkpoint):
    loaded = load_checkpoint(qwen35_checkpoint.path)
    assert loaded.vision is None and loaded.vision_tensors == {}


def test_stamp_covers_the_tower(checkpoint_factory, copy_checkpoint):
    ckpt = vlm_checkpoint(checkpoint_factory)
    base = load_checkpoint(ckpt.path).structural_hash
    changed = copy_checkpoint(ckpt.path)
    assert load_checkpoint(changed).structural_hash == base
    tensors = load_file(changed / "model.safetensors")
    tensors["model.visual.merger.linear_fc2.bias"] = tensors["model.visual.merger.linear_fc2.bias"] + 1
    save_file(tensors, changed / "model.safetensors", metadata={"format": "pt"})
    assert load_checkpoint(changed).structural_hash != base


def test_misshapen_and_missing_vision_tensors_are_refused(checkpoint_factory, copy_checkpoint):
    ckpt = vlm_checkpoint(checkpoint_factory)
    bad = copy_checkpoint(ckpt.path)
    tensors = load_file(bad / "model.safetensors")
    tensors["model.visual.pos_embed.weight"] = torch.zeros(9, 32)
    del tensors["model.visual.blocks.0.attn.proj.bias"]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="pos_embed.*expected.*missing vision tensor blocks.0.attn.proj.bias"):
        load_checkpoint(bad)


def test_malformed_vision_config_is_refused(checkpoint_factory, copy_checkpoint):
    bad = copy_checkpoint(vlm_checkpoint(checkpoint_factory).path)
    raw = json.loads((bad / "config.json").read_text())
    raw["vision_config"]["num_position_embeddings"] = 15
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="square"):
        load_checkpoint(bad)
