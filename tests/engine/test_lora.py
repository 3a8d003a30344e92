"""LoRA adapters (engine.models.lora) on tiny checkpoints of both families, against merged weights.

A batch mixes lanes of two adapters and lanes of none: each adapter's rows
match transformers' forward with that adapter merged into the weights
(``W + scale * B @ A``), the other rows match the base model exactly, in one
prefill and over decode steps; a bad adapter is refused at load, naming it.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.build import load_model
from ignis.engine.models.config import CheckpointError
from ignis.engine.models.lora import LoraLinear, LoraSet, read_adapter
from tests.engine.checkpoints import make_checkpoint
from tests.engine.lora_adapters import merged_reference, write_adapter
from tests.engine.test_model_forward import FP32_TOL, new_state, prompt, reference_logits, rel_err, run_chunked


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    ckpt = make_checkpoint(root, request.param)
    pairs_a = write_adapter(root / "adapter-a", ckpt.model, rank=4, alpha=8.0, seed=1)
    pairs_b = write_adapter(root / "adapter-b", ckpt.model, rank=2, alpha=4.0, seed=2, rslora=True,
                            targets=r"(q_proj|k_proj|down_proj|in_proj_z|in_proj_qkvz)$")
    model, _ = load_model(ckpt.path)
    lora = LoraSet(model, [read_adapter("a", root / "adapter-a", model, 64),
                           read_adapter("b", root / "adapter-b", model, 64)])
    refs = {"a": merged_reference(ckpt.model, pairs_a, 8.0 / 4), "b": merged_reference(ckpt.model, pairs_b, 4.0 / 2 ** 0.5),
            None: ckpt.model}
    return model, lora, refs, root, ckpt


def test_each_adapters_rows_match_its_merged_weights_in_one_mixed_batch(served):
    model, lora, refs, _, _ = served
    assert any(isinstance(m, LoraLinear) for m in model.modules())
    state = new_state(model)
    lanes = {0: "a", 1: None, 2: "b", 3: "a"}
    prompts = {lane: prompt(40 + 7 * lane, 10 + lane) for lane in lanes}
    for lane, name in lanes.items():
        lora.assign(lane, -1 if name is None else lora.slot(name))
        state.reset_lane(lane)
    pages = {lane: list(range(lane * 4, lane * 4 + 4)) for lane in lanes}
    chunks = [SeqChunk(prompts[lane], 0, pages[lane], lane) for lane in lanes]
    with torch.no_grad():
        got = model(ForwardBatch.build(chunks), state, all_logits=True)
    row = 0
    for lane, name in lanes.items():
        n = len(prompts[lane])
        want = reference_logits(refs[name], prompts[lane])
        assert rel_err(got[row:row + n], want) < FP32_TOL, (lane, name)
        if name is not None:
            assert rel_err(got[row:row + n], reference_logits(refs[None], prompts[lane])) > 1e-3
        row += n
    # decode steps of every lane together, each on its adapter
    for step in range(3):
        ids = {lane: [(7 * lane + step) % 100] for lane in lanes}
        chunks = [SeqChunk(ids[lane], len(prompts[lane]), pages[lane], lane) for lane in lanes]
        with torch.no_grad():
            logits = model(ForwardBatch.build(chunks), state)
        for i, (lane, name) in enumerate(lanes.items()):
            prompts[lane] = prompts[lane] + ids[lane]
            assert rel_err(logits[i:i + 1], reference_logits(refs[name], prompts[lane])[-1:]) < FP32_TOL
    for lane in lanes:
        lora.assign(lane, -1)


def test_without_adapter_lanes_the_model_is_the_base_model(served):
    model, lora, refs, _, _ = served
    ids = prompt(100, 5)
    got = run_chunked(model, new_state(model), ids, [37], list(range(4)))
    assert rel_err(got, reference_logits(refs[None], ids)) < FP32_TOL


def _edited(root, name, edit_config=None, edit_files=None):
    dst = root / f"edited-{name}"
    shutil.copytree(root / "adapter-a", dst)
    if edit_config is not None:
        cfg = json.loads((dst / "adapter_config.json").read_text())
        edit_config(cfg)
        (dst / "adapter_config.json").write_text(json.dumps(cfg))
    if edit_files is not None:
        edit_files(dst)
    return dst


def _drop_b(dst):
    from safetensors.torch import load_file, save_file

    t = load_file(str(dst / "adapter_model.safetensors"))
    first_b = next(k for k in sorted(t) if k.endswith("lora_B.weight"))
    del t[first_b]
    save_file(t, str(dst / "adapter_model.safetensors"))


def _expert_target(dst):
    from safetensors.torch import load_file, save_file

    t = load_file(str(dst / "adapter_model.safetensors"))
    t["base_model.model.model.layers.0.mlp.experts.0.down_proj.lora_A.weight"] = torch.zeros(4, 32)
    t["base_model.model.model.layers.0.mlp.experts.0.down_proj.lora_B.weight"] = torch.zeros(64, 4)
    save_file(t, str(dst / "adapter_model.safetensors"))


@pytest.mark.parametrize("case, message", [
    ("rank", "above --max-lora-rank"),
    ("dora", "use_dora=True is not supported"),
    ("bias", "bias='all' is not supported"),
    ("pickle", "adapter_model.bin"),
    ("pair", "without its pair"),
    ("unknown", "the model has no layer"),
    ("experts", "not a linear layer"),
    ("head", "LoRA on lm_head is not supported"),
])
def test_a_bad_adapter_is_refused_naming_it(served, tmp_path, case, message):
    model, _, _, root, ckpt = served
    if case == "experts" and ckpt.model.config.model_type != "qwen3_next":
        pytest.skip("only the MoE family has experts")
    edits = {
        "rank": dict(),
        "dora": dict(edit_config=lambda c: c.update(use_dora=True)),
        "bias": dict(edit_config=lambda c: c.update(bias="all")),
        "pickle": dict(edit_files=lambda d: ((d / "adapter_model.safetensors").rename(d / "adapter_model.bin"))),
        "pair": dict(edit_files=_drop_b),
        "unknown": dict(edit_files=lambda d: _rename_module(d)),
        "experts": dict(edit_files=_expert_target),
        "head": dict(edit_files=_head_target),
    }[case]
    path = _edited(root, f"{case}-{tmp_path.name}", **edits)
    with pytest.raises(CheckpointError, match=message) as err:
        read_adapter("bad", path, model, 2 if case == "rank" else 64)
    assert "LoRA adapter bad" in str(err.value)


def _rename_module(dst):
    from safetensors.torch import load_file, save_file

    t = load_file(str(dst / "adapter_model.safetensors"))
    t = {k.replace("layers.0.", "layers.99.", 1): v for k, v in t.items()}
    save_file(t, str(dst / "adapter_model.safetensors"))


def test_a_runner_sets_each_lanes_adapter_and_adapter_requests_do_not_draft(served):
    from ignis.engine.runner import ModelRunner
    from ignis.engine.schedule import LaneStart, RoundPlan
    from ignis.shared.sampling import SamplingParams

    model, lora, _, _, _ = served
    runner = ModelRunner(model, new_state(model))
    class Drafter:  # a drafter in use: who may draft is the question
        def forget(self, lane):
            pass

        def begin(self, lane, tokens):
            pass

    runner.spec = Drafter()
    plan = RoundPlan()
    plan.started.extend([LaneStart("tuned", 0, SamplingParams(max_tokens=2), (1, 2, 3), adapter=lora.slot("b")),
                         LaneStart("plain", 1, SamplingParams(max_tokens=2), (1, 2, 3))])
    runner._start(plan)
    assert lora.takes([0]) and not lora.takes([1])
    assert not runner.speculates("tuned") and runner.speculates("plain")
    runner.release("tuned")
    plan = RoundPlan()
    plan.started.append(LaneStart("next", 0, SamplingParams(max_tokens=2), (1, 2, 3)))
    runner._start(plan)
    assert not lora.takes([0, 1]) and runner.speculates("next")


def test_an_adapters_identity_is_its_name_and_the_digest_of_its_files(served, tmp_path):
    model, lora, _, root, _ = served
    a = read_adapter("a", root / "adapter-a", model, 64)
    assert a.identity == lora.identity(lora.slot("a")) and a.identity.startswith("a@") and len(a.digest) == 64
    changed = _edited(root, f"retrained-{tmp_path.name}", edit_config=lambda c: c.update(lora_alpha=9.0))
    assert read_adapter("a", changed, model, 64).identity != a.identity  # same name, other files: other scope


def _head_target(dst):
    from safetensors.torch import load_file, save_file

    t = load_file(str(dst / "adapter_model.safetensors"))
    t["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 64)
    t["base_model.model.lm_head.lora_B.weight"] = torch.zeros(128, 4)
    save_file(t, str(dst / "adapter_model.safetensors"))
