"""Test helpers: PEFT-format LoRA adapters for tiny checkpoints, and their merged-weight reference.

``write_adapter`` saves random ``lora_A``/``lora_B`` pairs for the linear layers
a pattern picks (as PEFT names them: ``base_model.model.<module>.lora_A.weight``)
with an ``adapter_config.json``; ``merged_reference`` is a copy of the
transformers model with ``W + scale * B @ A`` folded into each adapted weight,
the reference a served adapter is compared against.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

DEFAULT_TARGETS = r"(q_proj|v_proj|o_proj|in_proj_qkv|in_proj_qkvz|in_proj_z|out_proj|gate_proj|up_proj|down_proj)$"


def write_adapter(out: Path, hf_model, *, rank: int = 4, alpha: float = 8.0, seed: int = 0,
                  targets: str = DEFAULT_TARGETS, rslora: bool = False, spread: float = 0.5) -> dict:
    """An adapter for ``hf_model``'s linear layers whose names match ``targets`` (experts are left out);
    returns {module name: (A, B)} with the module names as the checkpoint spells them."""
    gen = torch.Generator().manual_seed(seed)
    tensors, pairs = {}, {}
    for name, module in hf_model.named_modules():
        if not isinstance(module, torch.nn.Linear) or not re.search(targets, name) or ".experts." in name:
            continue
        a = torch.randn(rank, module.in_features, generator=gen) * spread / module.in_features ** 0.5
        b = torch.randn(module.out_features, rank, generator=gen) * spread / rank ** 0.5
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
        pairs[name] = (a, b)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora, "bias": "none",
        "target_modules": sorted({n.rsplit(".", 1)[-1] for n in pairs}), "modules_to_save": None,
        "task_type": "CAUSAL_LM"}))
    return pairs


def merged_reference(hf_model, pairs: dict, scale: float):
    """A copy of ``hf_model`` with each adapted weight replaced by ``W + scale * B @ A``."""
    merged = copy.deepcopy(hf_model)
    modules = dict(merged.named_modules())
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            w = modules[name].weight
            w.add_((scale * (b.double() @ a.double())).to(w.dtype))
    return merged
