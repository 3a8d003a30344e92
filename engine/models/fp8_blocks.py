"""Block-wise fp8 checkpoints (Qwen's and DeepSeek's ``-FP8`` releases): what they say and how they load.

Such a checkpoint's ``config.json`` carries

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

and each quantized linear weight ``X.weight`` is stored as ``float8_e4m3fn``
beside ``X.weight_scale_inv``: one float32 per ``bm x bn`` block of the weight
(``ceil(out / bm) x ceil(in / bn)``, the last blocks ragged), whose real value
is ``weight * scale`` over the block (the name is the quantizer's: the inverse
of the scale it divided by). Tensors without a scale (norms, embeddings, the
head, gates, the modules left out) are stored in the checkpoint's float dtype.

ignis loads them by dequantizing each quantized weight once, at load, into the
load dtype (bf16 on CUDA): the served model is the fp8 checkpoint's weights
exactly as their blocks describe them, in the memory a bf16 checkpoint takes.
Any other quantization (a method other than ``fp8``, fp8 without block scales,
static activation scales) is refused at load with its name, never loaded as
if it were plain weights. The block size joins the model's structural hash, so
state retained under an fp8 checkpoint is never resumed under its bf16 sibling.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ignis.engine.models.checkpoint_error import safetensors_file

if TYPE_CHECKING:
    import torch

SCALE_SUFFIX = ".weight_scale_inv"
FP8_DTYPE = "F8_E4M3"
"""The safetensors dtype of a block-quantized weight (torch's ``float8_e4m3fn``)."""


def parse_quantization(raw: dict, text: dict) -> tuple[int, int] | None:
    """The weight block size of a block-wise fp8 checkpoint, None for an unquantized one; any other
    quantization raises ValueError naming it (``config_from_dict`` says it is config.json's)."""
    q = raw.get("quantization_config", text.get("quantization_config"))
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ValueError("quantization_config must be an object")
    method = q.get("quant_method")
    if method != "fp8":
        raise ValueError(
            f"quantization method {method!r} is not supported (ignis loads float checkpoints "
            "and block-wise fp8 ones, quant_method 'fp8' with weight_block_size)")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"fp8 format {fmt!r} is not supported (e4m3 is)")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"fp8 activation_scheme {scheme!r} is not supported (dynamic is)")
    block = q.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or not all(type(b) is int and b >= 1 for b in block)):
        raise ValueError("fp8 quantization without a weight_block_size of two positive "
                              f"integers is not supported, got {block!r}")
    return block[0], block[1]


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid of a weight of ``shape`` (out, in)."""
    out, inner = shape
    return -(-out // block[0]), -(-inner // block[1])


def dequantize(weight: "torch.Tensor", scale: "torch.Tensor", block: tuple[int, int]) -> "torch.Tensor":
    """``weight`` (fp8, out x in) times its block's ``scale``, in float32, on ``weight``'s device."""
    import torch

    out, inner = weight.shape
    s = scale.to(device=weight.device, dtype=torch.float32)
    s = s.repeat_interleave(block[0], dim=0)[:out].repeat_interleave(block[1], dim=1)[:, :inner]
    return weight.to(torch.float32) * s


def read_scales(scales: dict[str, tuple[Path, str]]) -> dict[str, "torch.Tensor"]:
    """Weight name -> its block scales, read up front (small: one float per block); ``scales``: weight name ->
    (file, scale tensor name)."""
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for weight, (path, name) in scales.items():
        by_file.setdefault(path, []).append((weight, name))
    out = {}
    for path, items in sorted(by_file.items()):
        with safetensors_file(path) as f:
            for weight, name in items:
                out[weight] = f.get_tensor(name)
    return out
