"""The weight inventory of the vision tower: names and shapes, from the config alone.

Pure Python (no torch). Canonical vision names are the checkpoint's names
without the ``model.visual.`` (VLM layout) or ``visual.`` prefix, which are
the module names of ``engine.models.vision.VisionTower``.
"""

from __future__ import annotations

from ignis.engine.models.vision_config import VisionConfig
from ignis.engine.models.weights_spec import SET_ASIDE_PREFIXES


def vision_canonical(name: str) -> str | None:
    """The canonical name of a vision tensor found in a file (None: not a vision tensor)."""
    for prefix, kind in SET_ASIDE_PREFIXES.items():
        if kind == "vision" and name.startswith(prefix):
            return name[len(prefix):]
    return None


def expected_vision_tensors(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    d, inter, merged = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size * cfg.merge_unit
    out: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (d, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size),
        "patch_embed.proj.bias": (d,),
        "pos_embed.weight": (cfg.num_position_embeddings, d),
        "merger.norm.weight": (d,),
        "merger.norm.bias": (d,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (cfg.out_hidden_size, merged),
        "merger.linear_fc2.bias": (cfg.out_hidden_size,),
    }
    for i in range(cfg.depth):
        p = f"blocks.{i}."
        out.update({
            p + "norm1.weight": (d,), p + "norm1.bias": (d,),
            p + "norm2.weight": (d,), p + "norm2.bias": (d,),
            p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
            p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
            p + "mlp.linear_fc1.weight": (inter, d), p + "mlp.linear_fc1.bias": (inter,),
            p + "mlp.linear_fc2.weight": (d, inter), p + "mlp.linear_fc2.bias": (d,),
        })
    return out
