"""Build a ready-to-run :class:`HybridModel` from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch

from ignis.engine.models.loader import LoadedCheckpoint, load_checkpoint
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.vision import VisionTower
from ignis.kernels.backend import Ops

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_from_checkpoint(ckpt: LoadedCheckpoint, device: str = "cpu", ops: Ops | None = None) -> HybridModel:
    """Instantiate the model on the meta device, then take the checkpoint's tensors as its parameters.

    Nothing is allocated for the model itself: ``assign=True`` makes the loaded
    tensors (already on ``device``) the parameters, so the weights occupy the
    device once, not twice (a ``to_empty`` first would hold a second, dead copy
    in the allocator's cache until it is emptied)."""
    with torch.device("meta"):
        model = HybridModel(ckpt.config, ops=ops)
    model.load_state_dict(ckpt.tensors, strict=True, assign=True)
    # buffers are not in the checkpoint: compute them on the real device
    model.rotary.inv_freq = model.rotary.frequencies(device)
    if ckpt.vision is not None:
        with torch.device("meta"):
            tower = VisionTower(ckpt.vision)
        tower.load_state_dict(ckpt.vision_tensors, strict=True, assign=True)
        tower.inv_freq = tower.frequencies(device)
        model.attach_vision(tower.eval())
    left = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"checkpoint left {len(left)} tensors unset: {', '.join(left[:5])}")
    model.eval()
    return model


def load_model(model_dir: str | Path, dtype: str | None = None, device: str = "cpu",
               ops: Ops | None = None, progress: bool | None = None) -> tuple[HybridModel, LoadedCheckpoint]:
    ckpt = load_checkpoint(model_dir, dtype=dtype, device=device, progress=progress)
    return model_from_checkpoint(ckpt, device=device, ops=ops), ckpt
