"""Reading the vision tower's tensors from a checkpoint's files, and what of them the stamp covers.

The text loader (``engine.models.loader``) sets ``model.visual.*`` /
``visual.*`` names aside; here they are checked against
``expected_vision_tensors`` (every tensor present once, shapes right) and read
under their canonical names, converted to the load dtype. The reuse stamp
covers a loaded tower through ``vision_structure``: its config, its tensor
table and a digest of its weight values (the embeddings it produces are part
of every retained state that holds an image).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ignis.engine.models.checkpoint_error import CheckpointError, safetensors_file
from ignis.engine.models.fp8_blocks import FP8_DTYPE, dequantize, read_scales
from ignis.engine.models.vision_config import VisionConfig
from ignis.engine.models.vision_weights import expected_vision_tensors, vision_canonical
from ignis.engine.models.weights_spec import FLOAT_DTYPES, HeaderEntry

if TYPE_CHECKING:
    import torch


def read_vision_tensors(cfg: VisionConfig, names: list[str], inventory: dict[str, tuple[Path, HeaderEntry]],
                        dtype: "torch.dtype", device: "torch.device", scales: dict | None = None,
                        fp8_block: tuple[int, int] | None = None) -> dict[str, "torch.Tensor"]:
    """The tower's tensors under canonical names; raises naming every missing, unknown or misshapen one.
    A tensor named in ``scales`` is block-wise fp8 (``engine.models.fp8_blocks``): dequantized at read."""
    scales = scales or {}

    expected = expected_vision_tensors(cfg)
    where: dict[str, tuple[Path, str]] = {}
    seen: set[str] = set()
    problems = []
    for name in names:
        canonical = vision_canonical(name)
        path, entry = inventory[name]
        seen.add(canonical)
        if canonical not in expected:
            problems.append(f"unexpected vision tensor {name}")
        elif canonical in where:
            problems.append(f"vision tensor {canonical} is given twice ({where[canonical][1]} and {name})")
        elif entry.shape != expected[canonical]:
            problems.append(f"{name}: got {list(entry.shape)}, expected {list(expected[canonical])}")
        elif entry.dtype not in FLOAT_DTYPES and not (entry.dtype == FP8_DTYPE and name in scales):
            problems.append(f"{name}: non-floating-point dtype {entry.dtype}")
        else:
            where[canonical] = (path, name)
    problems += [f"missing vision tensor {c}" for c in expected if c not in seen]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise CheckpointError(f"vision tower: {shown}")
    scale_of = read_scales({name: scales[name] for _, name in where.values() if name in scales})
    out = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for canonical, (path, name) in where.items():
        by_file.setdefault(path, []).append((canonical, name))
    for path in sorted(by_file):
        with safetensors_file(path) as f:
            for canonical, name in by_file[path]:
                t = f.get_tensor(name)
                if name in scale_of:
                    t = dequantize(t.to(device), scale_of[name], fp8_block)
                out[canonical] = t.to(device=device, dtype=dtype).contiguous()
    return {c: out[c] for c in expected}


def vision_structure(cfg: VisionConfig, tensors: dict[str, "torch.Tensor"]) -> dict:
    """What the stamp covers of a loaded tower: config, tensor table, and a digest of the values."""
    import torch

    h = hashlib.blake2b(digest_size=16, person=b"ignis-vision")
    table = []
    for name in sorted(tensors):
        t = tensors[name]
        table.append([name, list(t.shape), str(t.dtype).removeprefix("torch.")])
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(dtype=torch.uint8).cpu().numpy().tobytes())
    return {"config": dataclasses.asdict(cfg), "tensors": table, "values": h.hexdigest()}

