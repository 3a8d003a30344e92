"""Block-wise fp8 checkpoints (engine.models.fp8_blocks): loaded as the weights their blocks describe.

A tiny random checkpoint of each family is block-quantized the way Qwen's
``-FP8`` releases are (every ``*_proj.weight`` as float8_e4m3fn beside a
``weight_scale_inv`` grid, the drafter's too; blocks of 16 x 32 so tensors hold
several blocks and ragged edges), and dequantized again by this test's own
loop over blocks into a float checkpoint. The engine loads the fp8 checkpoint
into exactly the dequantized float weights, its logits match transformers'
forward over them, its structural hash differs from the float one's, and
every other quantization, or a scale that does not fit, is refused by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ignis.engine.models.build import load_model
from ignis.engine.models.config import CheckpointError
from ignis.engine.models.loader import load_checkpoint
from tests.engine.checkpoints import make_checkpoint
from tests.engine.test_model_forward import FP32_TOL, new_state, prompt, reference_logits, rel_err, run_chunked

BLOCK = (16, 32)
FP8_MAX = 448.0


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _write(src: Path, dst: Path, tensors: dict[str, torch.Tensor], quantization: dict | None) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    save_file(tensors, str(dst / "model.safetensors"))
    if quantization is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = quantization
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _quantized(name: str, w: torch.Tensor) -> bool:
    """The tensors a release quantizes: linear weights (the text model's projections, the vision tower's)."""
    if w.dim() != 2:
        return False
    return name.endswith("_proj.weight") or (".visual." in name and name.endswith(".weight") and "embed" not in name)


def quantized_pair(src: Path, root: Path, block=BLOCK) -> tuple[Path, Path]:
    """``src`` block-quantized (fp8 checkpoint) and that dequantized again (float checkpoint)."""
    fp8, deq = {}, {}
    for name, w in _tensors(src).items():
        if not _quantized(name, w):
            fp8[name] = deq[name] = w
            continue
        out, inner = w.shape
        rows, cols = -(-out // block[0]), -(-inner // block[1])
        q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
        scale = torch.empty(rows, cols, dtype=torch.float32)
        back = torch.empty(w.shape, dtype=w.dtype)
        for i in range(rows):
            for j in range(cols):
                r, c = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
                part = w[r, c].float()
                s = max(float(part.abs().max()), 1e-12) / FP8_MAX
                scale[i, j] = s
                q[r, c] = (part / s).to(torch.float8_e4m3fn)
                back[r, c] = (q[r, c].float() * torch.tensor(s, dtype=torch.float32)).to(w.dtype)
        fp8[name], fp8[name[:-len(".weight")] + ".weight_scale_inv"] = q, scale
        deq[name] = back
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": list(block), "modules_to_not_convert": ["lm_head"]}
    return _write(src, root / "fp8", fp8, config), _write(src, root / "deq", deq, None)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_an_fp8_checkpoint_loads_as_its_dequantized_weights(tmp_path, family):
    ckpt = make_checkpoint(tmp_path, family, mtp="full")
    fp8_dir, deq_dir = quantized_pair(ckpt.path, tmp_path)
    fp8, deq = load_checkpoint(fp8_dir), load_checkpoint(deq_dir)
    assert fp8.config.fp8_block == BLOCK and deq.config.fp8_block is None
    assert fp8.tensors.keys() == deq.tensors.keys() and fp8.drafter_tensors.keys() == deq.drafter_tensors.keys()
    assert fp8.has_drafter and fp8.drafter_tensors
    quantized = 0
    for name in fp8.tensors:
        assert fp8.tensors[name].dtype == deq.tensors[name].dtype
        assert torch.equal(fp8.tensors[name], deq.tensors[name]), name
        quantized += name.endswith("_proj.weight") or "experts" in name
    for name in fp8.drafter_tensors:
        assert torch.equal(fp8.drafter_tensors[name], deq.drafter_tensors[name]), name
    assert quantized > 4
    assert fp8.structural_hash != deq.structural_hash  # state retained under one is never resumed under the other
    # the served forward over the fp8 checkpoint against transformers' over the dequantized weights
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.float32).eval()
    model, _ = load_model(fp8_dir)
    ids = prompt(150, 3)
    got = run_chunked(model, new_state(model), ids, [64], list(range(4)))
    assert rel_err(got, reference_logits(ref, ids)) < FP32_TOL
    # the weights did change: against the unquantized model the logits move
    assert rel_err(got, reference_logits(ckpt.model, ids)) > 1e-4


def test_a_multimodal_fp8_checkpoint_dequantizes_its_vision_tower_too(tmp_path):
    ckpt = make_checkpoint(tmp_path, "qwen3_5", multimodal=True)
    fp8_dir, deq_dir = quantized_pair(ckpt.path, tmp_path)
    stored = load_file(str(fp8_dir / "model.safetensors"))
    assert any(".visual." in n and n.endswith("_scale_inv") for n in stored)
    fp8, deq = load_checkpoint(fp8_dir), load_checkpoint(deq_dir)
    assert fp8.vision is not None and fp8.vision_tensors.keys() == deq.vision_tensors.keys()
    for name in fp8.vision_tensors:
        assert torch.equal(fp8.vision_tensors[name], deq.vision_tensors[name]), name
    for name in fp8.tensors:
        assert torch.equal(fp8.tensors[name], deq.tensors[name]), name


def _edit_config(path: Path, **quantization):
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {**cfg.get("quantization_config", {}), **quantization}
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    ckpt = make_checkpoint(root, "qwen3_5")
    return quantized_pair(ckpt.path, root)[0]


@pytest.mark.parametrize("edit, message", [
    ({"quant_method": "awq"}, "quantization method 'awq' is not supported"),
    ({"quant_method": "compressed-tensors"}, "quantization method 'compressed-tensors'"),
    ({"activation_scheme": "static"}, "activation_scheme 'static'"),
    ({"fmt": "e5m2"}, "fp8 format 'e5m2'"),
    ({"weight_block_size": None}, "without a weight_block_size"),
    ({"weight_block_size": [128]}, "without a weight_block_size"),
])
def test_other_quantizations_are_refused_by_name(fp8_checkpoint, tmp_path, edit, message):
    path = tmp_path / "edited"
    shutil.copytree(fp8_checkpoint, path)
    _edit_config(path, **edit)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def _rewrite_tensors(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_a_scale_that_is_missing_or_does_not_fit_is_refused(fp8_checkpoint, tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"
    gone = _rewrite_tensors(fp8_checkpoint, tmp_path / "gone", lambda t: t.pop(name + "_scale_inv"))
    with pytest.raises(CheckpointError, match="without its weight_scale_inv"):
        load_checkpoint(gone)
    small = _rewrite_tensors(fp8_checkpoint, tmp_path / "small",
                             lambda t: t.update({name + "_scale_inv": torch.ones(1, 1)}))
    with pytest.raises(CheckpointError, match="grid of 16x32 blocks"):
        load_checkpoint(small)
    orphan = _rewrite_tensors(fp8_checkpoint, tmp_path / "orphan",
                              lambda t: t.update({"model.layers.0.mlp.nothing.weight_scale_inv": torch.ones(1, 1)}))
    with pytest.raises(CheckpointError, match="which is missing"):
        load_checkpoint(orphan)
    unlabelled = tmp_path / "unlabelled"
    shutil.copytree(fp8_checkpoint, unlabelled)
    cfg = json.loads((unlabelled / "config.json").read_text())
    del cfg["quantization_config"]
    (unlabelled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="names no block-wise fp8 quantization_config"):
        load_checkpoint(unlabelled)


def test_inspect_says_what_an_fp8_checkpoint_stores_and_serves(fp8_checkpoint):
    from ignis.engine.inspect import build_report, render
    from ignis.engine.models.config import load_config

    cfg = load_config(fp8_checkpoint)
    report = build_report(fp8_checkpoint, cfg, 1 << 30)
    w = report["weights"]
    assert w["fp8_block"] == list(BLOCK) and "F8_E4M3" in w["stored_dtypes"]
    loaded = load_checkpoint(fp8_checkpoint)
    assert w["loaded_bytes"] == loaded.weight_bytes > w["bytes"] - sum(
        t.numel() * 4 for n, t in load_file(str(fp8_checkpoint / "model.safetensors")).items()
        if n.endswith("_scale_inv"))
    assert "dequantized to float32 at load" in render(report)
