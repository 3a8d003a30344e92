"""engine.models.layers.embedding: torch's own initialisation on a real device, none on the meta device."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from ignis.engine.models.layers import embedding


def test_on_the_cpu_it_draws_what_nn_embedding_draws():
    torch.manual_seed(3)
    ours = embedding(50, 8)
    torch.manual_seed(3)
    theirs = nn.Embedding(50, 8)
    assert isinstance(ours.weight, nn.Parameter) and ours.weight.requires_grad
    assert torch.equal(ours.weight, theirs.weight)
    assert torch.equal(ours(torch.tensor([0, 49])), theirs.weight[[0, 49]])


def test_a_model_built_on_the_meta_device_does_not_import_dynamo():
    """torch's meta ``normal_`` imports torch._dynamo (seconds of every engine start): a fresh
    interpreter builds a vision tower and a decoder on the meta device without it."""
    code = """
import sys
import torch
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.vision import VisionTower
from ignis.engine.models.vision_config import VisionConfig
from ignis.shared.demo.builder import model_config
vision = VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                      temporal_patch_size=2, spatial_merge_size=2, in_channels=3, num_position_embeddings=16,
                      hidden_act="gelu_pytorch_tanh", rope_theta=10000.0, image_token_id=120, video_token_id=121,
                      vision_start_token_id=122, vision_end_token_id=123, mrope_section=(3, 3, 2))
with torch.device("meta"):
    model = HybridModel(config_from_dict(model_config(248320, eos_id=1, pad_id=0)))
    tower = VisionTower(vision)
assert model.embed_tokens.weight.is_meta and model.embed_tokens.weight.shape[0] == 248320
assert tower.pos_embed.weight.is_meta
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "no dynamo"
