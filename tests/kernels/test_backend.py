"""The backend switch, and the whole model on the Triton forms against the torch twins.

The model check runs a tiny random Qwen3.5 (one linear-attention and one
full-attention layer) through a prefill step and a mixed decode + prefill
step with each backend; logits agree to a relative RMS of 1e-5 in fp32
(measured ~2e-7).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.kernels.backend import REFERENCE, TRITON_FORMS, select_ops, triton_ops
from tests.kernels.conftest import FRESH_PROCESS_TEST, IN_PROCESS, assert_close


def test_cpu_selects_the_reference(monkeypatch):
    monkeypatch.delenv("IGNIS_KERNELS", raising=False)
    assert select_ops("cpu") is REFERENCE
    monkeypatch.setenv("IGNIS_KERNELS", "reference")
    assert select_ops("cuda") is REFERENCE


def test_env_selects_every_triton_form(monkeypatch):
    monkeypatch.setenv("IGNIS_KERNELS", "triton")
    ops = select_ops("cpu")
    assert ops.name == "triton"
    for op, path in TRITON_FORMS.items():
        module, fn = path.split(":")
        assert getattr(ops, op) is getattr(importlib.import_module(module), fn), f"{op} fell back to its twin"


def test_bad_env_value_raises(monkeypatch):
    monkeypatch.setenv("IGNIS_KERNELS", "cutlass")
    with pytest.raises(ValueError, match="IGNIS_KERNELS"):
        select_ops("cpu")


TINY = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
}


def tiny_model(device) -> HybridModel:
    torch.manual_seed(0)
    model = HybridModel(config_from_dict(TINY)).to(device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms start at identity; make every weight matter
                p.add_(torch.randn_like(p) * 0.2)
    return model


def run_steps(model, ops, device) -> list[torch.Tensor]:
    model.ops = ops
    state = ModelState.allocate(model.cfg, num_pages=8, lanes=4, dtype=torch.float32, device=device,
                                fill=float("nan"))
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (80,), generator=gen).tolist()
    steps = [
        [SeqChunk(ids[:70], 0, [5, 2], 2), SeqChunk(ids[70:73], 0, [7], 0)],
        [SeqChunk(ids[73:74], 70, [5, 2], 2), SeqChunk(ids[74:78], 3, [7], 0), SeqChunk(ids[78:79], 0, [1], 3)],
    ]
    return [model(ForwardBatch.build(chunks, device), state, all_logits=True) for chunks in steps]


def test_model_on_triton_forms_matches_reference(device):
    model = tiny_model(device)
    want = run_steps(model, REFERENCE, device)
    got = run_steps(model, triton_ops(), device)
    for step, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, 1e-5, f"model logits, step {step}")


@pytest.mark.skipif(IN_PROCESS, reason="the kernel tests run in this process")
def test_kernel_suite_in_a_fresh_process():
    """Triton was imported before the interpreter flag: run this directory where it is not."""
    here = Path(__file__).resolve().parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here),
                           "-k", f"not {FRESH_PROCESS_TEST}"], cwd=here.parents[1],
                          env=dict(os.environ, IGNIS_TEST_DEVICE="cpu", TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
