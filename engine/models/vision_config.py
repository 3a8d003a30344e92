"""The structure of a Qwen3.5 checkpoint's vision side, parsed from its JSON files.

Pure Python (no torch). One :class:`VisionConfig` holds what the engine needs
to turn a resized picture into prompt embeddings and positions:

- the tower (``config.json`` ``vision_config``): depth, widths, heads, patch
  size, temporal patch size, spatial merge size, the learned position grid;
- the image tokens of the prompt (``image_token_id``, ``vision_start_token_id``,
  ``vision_end_token_id``, ``video_token_id``) at the top level of ``config.json``;
- the text model's mRoPE split of the rotary frequencies into (t, h, w)
  sections (``text_config.rope_parameters.mrope_section``, interleaved);
- the pixel normalisation (``preprocessor_config.json`` ``image_mean`` /
  ``image_std``; transformers' Qwen2-VL image processor defaults without it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ignis.engine.models.config import CheckpointError
from ignis.shared.image_grid import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, preprocessor_pixel_bounds
from ignis.shared.tokenizer_files import added_token_id

PREPROCESSOR_FILE = "preprocessor_config.json"
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MROPE_SECTION = (11, 11, 10)


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int
    num_position_embeddings: int
    hidden_act: str
    rope_theta: float
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    mrope_section: tuple[int, int, int]
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        """Patches merged into one prompt token."""
        return self.spatial_merge_size * self.spatial_merge_size

    @property
    def grid_per_side(self) -> int:
        """Side of the square learned position grid."""
        return int(self.num_position_embeddings ** 0.5)


def vision_config_from_dict(raw: dict, text: dict, preprocessor: dict | None = None,
                            pad_token_id: int | None = None) -> VisionConfig | None:
    """The vision side of a parsed ``config.json`` (None when it has no ``vision_config``); without an
    ``image_token_id`` there, the tokenizer's ``<|image_pad|>`` (``pad_token_id``), as the gateway reads it
    (``gateway.vision_settings``): the two processes must agree on the pad the prompt carries."""
    vis = raw.get("vision_config")
    if not isinstance(vis, dict):
        return None
    pre = preprocessor or {}
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    vrope = vis.get("rope_parameters") or {}
    min_pixels, max_pixels = preprocessor_pixel_bounds(pre)
    try:
        section = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_MROPE_SECTION))
        cfg = VisionConfig(
            depth=int(vis.get("depth", 27)),
            hidden_size=int(vis.get("hidden_size", 1152)),
            intermediate_size=int(vis.get("intermediate_size", 4304)),
            num_heads=int(vis.get("num_heads", 16)),
            out_hidden_size=int(vis.get("out_hidden_size", 3584)),
            patch_size=_single(vis.get("patch_size", pre.get("patch_size", 16)), "patch_size"),
            temporal_patch_size=_single(vis.get("temporal_patch_size", 2), "temporal_patch_size"),
            spatial_merge_size=int(vis.get("spatial_merge_size", pre.get("merge_size", 2))),
            in_channels=int(vis.get("in_channels", 3)),
            num_position_embeddings=int(vis.get("num_position_embeddings", 2304)),
            hidden_act=str(vis.get("hidden_act", "gelu_pytorch_tanh")),
            rope_theta=float(vrope.get("rope_theta", 10000.0)),
            image_token_id=int(raw.get("image_token_id", pad_token_id if pad_token_id is not None else 248056)),
            video_token_id=int(raw.get("video_token_id", 248057)),
            vision_start_token_id=int(raw.get("vision_start_token_id", 248053)),
            vision_end_token_id=int(raw.get("vision_end_token_id", 248054)),
            mrope_section=section,  # type: ignore[arg-type]
            image_mean=tuple(float(v) for v in pre.get("image_mean", OPENAI_CLIP_MEAN)),  # type: ignore[arg-type]
            image_std=tuple(float(v) for v in pre.get("image_std", OPENAI_CLIP_STD)),  # type: ignore[arg-type]
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"config.json: malformed vision field ({exc})") from None
    if len(cfg.mrope_section) != 3:
        raise CheckpointError(f"config.json: mrope_section needs 3 entries, got {list(cfg.mrope_section)}")
    if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 4:
        raise CheckpointError("config.json: vision head_dim must divide hidden_size and be a multiple of 4")
    if cfg.grid_per_side ** 2 != cfg.num_position_embeddings:
        raise CheckpointError("config.json: vision num_position_embeddings must be a square")
    if len(cfg.image_mean) != cfg.in_channels or len(cfg.image_std) != cfg.in_channels:
        raise CheckpointError(f"{PREPROCESSOR_FILE}: image_mean and image_std need {cfg.in_channels} entries")
    if cfg.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
        raise CheckpointError(f"config.json: vision activation {cfg.hidden_act!r} is not supported")
    return cfg


def _single(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise CheckpointError(f"config.json: non-square vision {name} {list(value)} is not supported")
        value = value[0]
    return int(value)


def load_vision_config(model_dir: str | Path) -> VisionConfig | None:
    """The vision side of a checkpoint directory (None for a text-only checkpoint)."""
    model_dir = Path(model_dir)
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{model_dir / 'config.json'}: cannot read ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{model_dir / 'config.json'}: expected a JSON object")
    pre = None
    path = model_dir / PREPROCESSOR_FILE
    if path.is_file():
        try:
            pre = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(pre, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
    pad = None if "image_token_id" in raw else added_token_id(model_dir, "<|image_pad|>")
    return vision_config_from_dict(raw, dict(raw.get("text_config") or raw), pre, pad)
