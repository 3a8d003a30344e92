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
               ops: Ops | None = None, progress: bool | None = None,
               drafter: bool = True, vision: bool = True) -> tuple[HybridModel, LoadedCheckpoint]:
    """``drafter``: also read the multi-token-prediction head's tensors (``drafter_from_checkpoint``);
    ``vision``: a multimodal checkpoint's vision tower (off: the language model alone, no images taken)."""
    ckpt = load_checkpoint(model_dir, dtype=dtype, device=device, progress=progress, drafter=drafter,
                           vision=vision)
    return model_from_checkpoint(ckpt, device=device, ops=ops), ckpt


def drafter_from_checkpoint(ckpt: LoadedCheckpoint):
    """The checkpoint's multi-token-prediction head (``engine.models.mtp``), or None when it has none."""
    if not ckpt.has_drafter:
        return None
    if not ckpt.drafter_tensors:
        raise ValueError("the drafter's tensors were not read (load the checkpoint with drafter=True)")
    from ignis.engine.models.mtp import head_from_tensors

    return head_from_tensors(ckpt.config, ckpt.drafter_tensors, ckpt.drafter_layers)
