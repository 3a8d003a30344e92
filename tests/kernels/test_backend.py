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
from ignis.kernels.backend import (
    REFERENCE,
    TRITON_FORMS,
    KernelPathError,
    kernel_info,
    require_kernel_path,
    select_ops,
    triton_ops,
)
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


def test_triton_ops_name_the_triton_path(monkeypatch):
    ops = triton_ops()
    assert ops.name == "triton" and ops.fallbacks == ()
    assert kernel_info(ops) == {"kernel_triton_ops": len(TRITON_FORMS), "kernel_twin_ops": 0,
                                "kernel_fallback_ops": 0}
    require_kernel_path(ops, "cuda", allow_fallback=False)


def test_a_form_that_fails_to_import_is_named_and_refused_on_cuda(monkeypatch, caplog):
    """One Triton module fails to import: that op runs its twin, the path is "mixed", and on CUDA the
    load is refused unless fallback is allowed (then a WARNING names the op)."""
    monkeypatch.delenv("IGNIS_KERNELS", raising=False)
    monkeypatch.setitem(sys.modules, "ignis.kernels.hq_e8.triton_prefill", None)  # import raises ImportError
    ops = select_ops("cuda")
    assert ops.name == "mixed"
    assert ops.hq_prefill_attention is REFERENCE.hq_prefill_attention
    assert ops.decode_attention is not REFERENCE.decode_attention
    assert len(ops.fallbacks) == 1 and ops.fallbacks[0].startswith("hq_prefill_attention: ModuleNotFoundError")
    assert kernel_info(ops) == {"kernel_triton_ops": len(TRITON_FORMS) - 1, "kernel_twin_ops": 1,
                                "kernel_fallback_ops": 1}
    with pytest.raises(KernelPathError, match="hq_prefill_attention") as refused:
        require_kernel_path(ops, "cuda", allow_fallback=False)
    assert "ignis.kernels.hq_e8.triton_prefill" in str(refused.value)  # the import error
    assert "--allow-torch-fallback" in str(refused.value)
    with caplog.at_level("WARNING", logger="ignis.kernels"):
        require_kernel_path(ops, "cuda", allow_fallback=True)
    assert any(r.levelname == "WARNING" and "hq_prefill_attention" in r.getMessage() and "mixed" in r.getMessage()
               for r in caplog.records)
    require_kernel_path(ops, "cpu", allow_fallback=False)  # the CPU serves on twins anyway


def test_triton_missing_is_refused_on_cuda(monkeypatch):
    """Triton itself cannot be imported: every op falls back, the path is "reference", and CUDA refuses."""
    monkeypatch.delenv("IGNIS_KERNELS", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)
    for path in TRITON_FORMS.values():
        monkeypatch.delitem(sys.modules, path.split(":")[0], raising=False)
    ops = select_ops("cuda")
    assert ops.name == "reference" and len(ops.fallbacks) == len(TRITON_FORMS)
    assert all(getattr(ops, op) is getattr(REFERENCE, op) for op in TRITON_FORMS)
    with pytest.raises(KernelPathError, match="triton") as refused:
        require_kernel_path(ops, "cuda", allow_fallback=False)
    assert all(op in str(refused.value) for op in TRITON_FORMS)
    require_kernel_path(ops, "cuda", allow_fallback=True)


def test_reference_chosen_on_cuda_is_allowed(monkeypatch):
    """IGNIS_KERNELS=reference on CUDA is a choice, not a fallback: allowed, path "reference"."""
    monkeypatch.setenv("IGNIS_KERNELS", "reference")
    ops = select_ops("cuda")
    assert ops is REFERENCE and ops.name == "reference" and ops.fallbacks == ()
    require_kernel_path(ops, "cuda", allow_fallback=False)
    assert kernel_info(ops) == {"kernel_triton_ops": 0, "kernel_twin_ops": len(TRITON_FORMS),
                                "kernel_fallback_ops": 0}


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
# The released models' head ratios in miniature: 3 value heads per key head, 6 query heads per KV head,
# a quarter of each attention head rotated, key and value head dims that differ.
RATIOS_OF_27B = dict(TINY, num_attention_heads=6, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                     linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=16,
                     rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25))


def tiny_model(device, config: dict = TINY) -> HybridModel:
    torch.manual_seed(0)
    model = HybridModel(config_from_dict(config)).to(device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms start at identity; make every weight matter
                p.add_(torch.randn_like(p) * 0.2)
    return model


def run_steps(model, ops, device) -> list[torch.Tensor]:
    """Logits of three forwards (the last keeps state images part way through two chunks), then the
    kept images."""
    model.ops = ops
    state = ModelState.allocate(model.cfg, num_pages=8, lanes=4, dtype=torch.float32, device=device,
                                fill=float("nan"))
    state.allocate_slots(0, 3)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (80,), generator=gen).tolist()
    steps = [
        [SeqChunk(ids[:70], 0, [5, 2], 2), SeqChunk(ids[70:73], 0, [7], 0)],
        [SeqChunk(ids[73:74], 70, [5, 2], 2), SeqChunk(ids[74:78], 3, [7], 0), SeqChunk(ids[78:79], 0, [1], 3)],
        [SeqChunk(ids[10:11], 71, [5, 2], 2), SeqChunk(ids[:50], 0, [3], 1, keeps=((17, 0), (47, 1))),
         SeqChunk(ids[20:30], 7, [7], 0, keeps=((9, 2),))],
    ]
    logits = [model(ForwardBatch.build(chunks, device), state, all_logits=True) for chunks in steps]
    return logits + [state.slot_ssm[1].clone(), state.slot_conv[1].clone()]


@pytest.mark.parametrize("config", [TINY, RATIOS_OF_27B], ids=["tiny", "ratios_of_27b"])
def test_model_on_triton_forms_matches_reference(device, config):
    model = tiny_model(device, config)
    want = run_steps(model, REFERENCE, device)
    got = run_steps(model, triton_ops(), device)
    for step, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, 1e-5, f"model logits, step {step}" if step < 3 else f"kept images ({step - 3})")
    assert float(want[3].abs().amax(dim=(0, 2, 3, 4)).min()) > 0  # every slot was kept


@pytest.mark.skipif(IN_PROCESS, reason="the kernel tests run in this process")
def test_kernel_suite_in_a_fresh_process():
    """Triton was imported before the interpreter flag: run this directory where it is not."""
    here = Path(__file__).resolve().parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here),
                           "-k", f"not {FRESH_PROCESS_TEST}"], cwd=here.parents[1],
                          env=dict(os.environ, IGNIS_TEST_DEVICE="cpu", TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
