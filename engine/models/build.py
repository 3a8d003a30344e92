"""Build a ready-to-run :class:`HybridModel` from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch

from ignis.engine.models.loader import LoadedCheckpoint, load_checkpoint
from ignis.engine.models.hybrid import HybridModel
from ignis.kernels.backend import Ops

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_from_checkpoint(ckpt: LoadedCheckpoint, device: str = "cpu", ops: Ops | None = None) -> HybridModel:
    """Instantiate the model without initialising weights, then load the tensors in place."""
    with torch.device("meta"):
        model = HybridModel(ckpt.config, ops=ops)
    model.to_empty(device=device)
    model.load_state_dict(ckpt.tensors, strict=True, assign=True)
    # buffers are not in the checkpoint: recompute them on the real device
    model.rotary.inv_freq = model.rotary.frequencies(device)
    model.eval()
    return model


def load_model(model_dir: str | Path, dtype: str | None = None, device: str = "cpu",
               ops: Ops | None = None, progress: bool | None = None) -> tuple[HybridModel, LoadedCheckpoint]:
    ckpt = load_checkpoint(model_dir, dtype=dtype, device=device, progress=progress)
    return model_from_checkpoint(ckpt, device=device, ops=ops), ckpt
