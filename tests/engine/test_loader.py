"""Checkpoint loading: every layout, dtype rules, set-aside weights and each error message."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from ignis.engine.models.loader import load_checkpoint, resolve_dtype
from ignis.engine.models.config import CheckpointError, load_config
from ignis.engine.models.weights_spec import classify, expected_tensors, read_header
from tests.engine.checkpoints import FAMILIES, canonical_state_dict


def rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def assert_matches_model(loaded, model):
    want = canonical_state_dict(model)
    assert set(loaded.tensors) == set(want)
    for name, tensor in want.items():
        got = loaded.tensors[name]
        assert got.shape == tensor.shape, name
        torch.testing.assert_close(got.float(), tensor.float(), rtol=0, atol=0, msg=name)


# ----- the canonical inventory against transformers --------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pattern,tie", [("interval4", False), ("interval2", True), ("all_full", False)])
def test_expected_tensors_match_transformers(checkpoint_factory, family, pattern, tie):
    ckpt = checkpoint_factory(family, layer_pattern=pattern, tie=tie)
    cfg = load_config(ckpt.path)
    want = {n: tuple(t.shape) for n, t in canonical_state_dict(ckpt.model).items()}
    assert expected_tensors(cfg) == want


def test_expected_tensors_dense_layers_in_moe_model(checkpoint_factory):
    ckpt = checkpoint_factory("qwen3_next", config_overrides={"mlp_only_layers": [1]})
    cfg = load_config(ckpt.path)
    spec = expected_tensors(cfg)
    assert "layers.1.mlp.gate_proj.weight" in spec and "layers.1.mlp.experts.gate_up_proj" not in spec
    assert spec == {n: tuple(t.shape) for n, t in canonical_state_dict(ckpt.model).items()}


def test_classify_names():
    assert classify("model.language_model.layers.2.mlp.up_proj.weight").canonical == "layers.2.mlp.up_proj.weight"
    assert classify("model.norm.weight").canonical == "norm.weight"
    assert classify("lm_head.weight").canonical == "lm_head.weight"
    assert classify("model.visual.blocks.0.attn.qkv.weight").kind == "vision"
    assert classify("visual.merger.norm.weight").kind == "vision"
    assert classify("mtp.fc.weight").kind == "mtp"
    e = classify("model.layers.3.mlp.experts.7.up_proj.weight")
    assert (e.kind, e.canonical, e.expert, e.part) == ("expert", "layers.3.mlp.experts.gate_up_proj", 7, "up_proj")
    d = classify("model.layers.3.mlp.experts.7.down_proj.weight")
    assert d.canonical == "layers.3.mlp.experts.down_proj"


# ----- layouts ----------------------------------------------------------------
def test_load_text_checkpoint(text_checkpoint):
    loaded = load_checkpoint(text_checkpoint.path)
    assert_matches_model(loaded, text_checkpoint.model)
    assert loaded.dtype == "float32"
    assert loaded.set_aside == {}
    assert loaded.weight_bytes == sum(t.numel() * 4 for t in loaded.tensors.values())
    assert len(loaded.structural_hash) == 64


def test_moe_experts_are_stacked_from_per_expert_files(qwen3_next_checkpoint):
    names = read_header(qwen3_next_checkpoint.path / "model.safetensors")
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in names
    assert "model.layers.0.mlp.experts.gate_up_proj" not in names
    loaded = load_checkpoint(qwen3_next_checkpoint.path)
    experts = qwen3_next_checkpoint.model.model.layers[0].mlp.experts
    inter = loaded.config.moe_intermediate_size
    gate_up = loaded.tensors["layers.0.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (4, 2 * inter, 64)
    torch.testing.assert_close(gate_up, experts.gate_up_proj.detach(), rtol=0, atol=0)
    file_tensors = load_file(qwen3_next_checkpoint.path / "model.safetensors")
    torch.testing.assert_close(gate_up[2, :inter], file_tensors["model.layers.0.mlp.experts.2.gate_proj.weight"])
    torch.testing.assert_close(gate_up[2, inter:], file_tensors["model.layers.0.mlp.experts.2.up_proj.weight"])


def test_moe_already_fused_form(qwen3_next_checkpoint, tmp_path):
    src = qwen3_next_checkpoint
    (tmp_path / "config.json").write_text((src.path / "config.json").read_text())
    fused = {"model." + n: t.contiguous() for n, t in canonical_state_dict(src.model).items()
             if not n.startswith("lm_head")}
    fused["lm_head.weight"] = src.model.lm_head.weight.detach().contiguous()
    save_file(fused, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_matches_model(load_checkpoint(tmp_path), src.model)


def test_multimodal_layout_sets_aside_vision_and_mtp(multimodal_checkpoint):
    header = read_header(multimodal_checkpoint.path / "model.safetensors")
    assert any(n.startswith("model.language_model.layers.") for n in header)
    loaded = load_checkpoint(multimodal_checkpoint.path)
    assert loaded.config.multimodal and loaded.config.architecture == "Qwen3_5ForConditionalGeneration"
    assert_matches_model(loaded, multimodal_checkpoint.model)
    vision = [n for n in header if n.startswith("model.visual.")]
    assert vision and loaded.set_aside["vision"] == sorted(vision)
    assert loaded.set_aside["mtp"] == ["mtp.fc.weight", "mtp.norm.weight"]
    assert loaded.vision is not None and loaded.vision_tensors
    text_only = load_checkpoint(multimodal_checkpoint.path, vision=False)  # --language-model-only
    assert text_only.vision is None and not text_only.vision_tensors
    assert text_only.set_aside["vision"] == sorted(vision)  # left on disk, still checked by name
    assert_matches_model(text_only, multimodal_checkpoint.model)
    assert text_only.structural_hash != loaded.structural_hash  # no state of one is resumed by the other


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_checkpoint(checkpoint_factory, family):
    ckpt = checkpoint_factory(family, max_shard_size="60KB", mtp=True)
    shards = sorted(p.name for p in ckpt.path.glob("*.safetensors"))
    assert len(shards) > 2 and (ckpt.path / "model.safetensors.index.json").is_file()
    loaded = load_checkpoint(ckpt.path)
    assert_matches_model(loaded, ckpt.model)
    assert loaded.set_aside["mtp"] == ["mtp.fc.weight", "mtp.norm.weight"]
    single = load_checkpoint(checkpoint_factory(family).path)
    assert loaded.structural_hash == single.structural_hash


@pytest.mark.parametrize("family", FAMILIES)
def test_tied_embeddings(checkpoint_factory, family):
    ckpt = checkpoint_factory(family, tie=True)
    assert "lm_head.weight" not in read_header(ckpt.path / "model.safetensors")
    loaded = load_checkpoint(ckpt.path)
    assert loaded.config.tie_word_embeddings and "lm_head.weight" not in loaded.tensors
    assert_matches_model(loaded, ckpt.model)
    untied = load_checkpoint(checkpoint_factory(family).path)
    assert "lm_head.weight" in untied.tensors
    assert loaded.structural_hash != untied.structural_hash


def test_tied_checkpoint_with_lm_head_ignores_it_and_says_so(checkpoint_factory, copy_checkpoint, caplog):
    path = copy_checkpoint(checkpoint_factory("qwen3_5", tie=True).path)
    rewrite(path / "model.safetensors", lambda t: t.update({"lm_head.weight": torch.zeros(128, 64)}))
    with caplog.at_level("WARNING", logger="ignis.engine"):
        loaded = load_checkpoint(path)
    assert "lm_head.weight" not in loaded.tensors
    assert any("lm_head.weight is not used" in r.getMessage() for r in caplog.records)  # not silently


def test_multimodal_tied(checkpoint_factory):
    ckpt = checkpoint_factory("qwen3_5", multimodal=True, tie=True)
    loaded = load_checkpoint(ckpt.path)
    assert "lm_head.weight" not in loaded.tensors
    assert_matches_model(loaded, ckpt.model)


# ----- dtype ------------------------------------------------------------------
def test_dtype_conversion_keeps_decay_params_fp32(qwen3_next_checkpoint):
    loaded = load_checkpoint(qwen3_next_checkpoint.path, dtype="bf16")
    assert loaded.dtype == "bfloat16"
    for name, t in loaded.tensors.items():
        want = torch.float32 if name.endswith((".A_log", ".dt_bias")) else torch.bfloat16
        assert t.dtype == want, name
    ref = canonical_state_dict(qwen3_next_checkpoint.model)
    torch.testing.assert_close(loaded.tensors["layers.0.linear_attn.A_log"], ref["layers.0.linear_attn.A_log"],
                               rtol=0, atol=0)
    torch.testing.assert_close(loaded.tensors["embed_tokens.weight"], ref["embed_tokens.weight"].bfloat16())
    fp32 = load_checkpoint(qwen3_next_checkpoint.path)
    assert loaded.structural_hash != fp32.structural_hash
    assert loaded.weight_bytes < fp32.weight_bytes


def test_dtype_default_is_checkpoint_dtype_on_cpu(checkpoint_factory):
    ckpt = checkpoint_factory("qwen3_5", dtype="bfloat16")
    loaded = load_checkpoint(ckpt.path)
    assert loaded.dtype == "bfloat16"
    assert loaded.tensors["layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert loaded.tensors["layers.0.linear_attn.dt_bias"].dtype == torch.float32
    assert load_checkpoint(ckpt.path, dtype="float32").tensors["norm.weight"].dtype == torch.float32
    assert load_checkpoint(ckpt.path, dtype="fp16").tensors["norm.weight"].dtype == torch.float16


def test_resolve_dtype():
    assert resolve_dtype(None, "cpu", "float32") == "float32"
    assert resolve_dtype("auto", "cpu", "bfloat16") == "bfloat16"
    assert resolve_dtype(None, "cuda", "float32") == "bfloat16"
    assert resolve_dtype("auto", "cuda:0", "float32") == "bfloat16"
    assert resolve_dtype("FP32", "cuda", "bfloat16") == "float32"
    assert resolve_dtype("half", "cuda", "bfloat16") == "float16"  # vLLM's names
    assert resolve_dtype("float", "cpu", "bfloat16") == "float32"
    with pytest.raises(ValueError, match="--dtype"):
        resolve_dtype("int8", "cpu", "float32")


def test_structural_hash_is_stable(qwen35_checkpoint, qwen3_next_checkpoint):
    a = load_checkpoint(qwen35_checkpoint.path).structural_hash
    assert a == load_checkpoint(qwen35_checkpoint.path).structural_hash
    assert a != load_checkpoint(qwen3_next_checkpoint.path).structural_hash


def test_progress_bar(qwen35_checkpoint, capsys):
    load_checkpoint(qwen35_checkpoint.path, progress=True)
    assert "loading weights" in capsys.readouterr().err
    load_checkpoint(qwen35_checkpoint.path)  # stderr is not a TTY under pytest
    assert "loading weights" not in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_load_to_cuda(qwen3_next_checkpoint):
    loaded = load_checkpoint(qwen3_next_checkpoint.path, device="cuda")
    assert loaded.dtype == "bfloat16"
    assert all(t.is_cuda for t in loaded.tensors.values())


# ----- errors -----------------------------------------------------------------
def test_missing_tensor(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    rewrite(path / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.down_proj\.weight.*model\.safetensors"):
        load_checkpoint(path)


def test_missing_expert_slice(qwen3_next_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen3_next_checkpoint.path)
    rewrite(path / "model.safetensors", lambda t: t.pop("model.layers.2.mlp.experts.1.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.experts\.1\.up_proj\.weight"):
        load_checkpoint(path)


def test_missing_lm_head_when_untied(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    rewrite(path / "model.safetensors", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors: lm_head\.weight"):
        load_checkpoint(path)


def test_wrong_shape(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    name = "model.layers.3.self_attn.k_proj.weight"
    rewrite(path / "model.safetensors", lambda t: t.update({name: torch.zeros(16, 64)}))
    with pytest.raises(CheckpointError, match=r"self_attn\.k_proj\.weight.*got \[16, 64\], expected \[32, 64\]"):
        load_checkpoint(path)


def test_unknown_extra_tensor(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    rewrite(path / "model.safetensors", lambda t: t.update({"model.layers.0.mlp.scale_inv": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*model\.layers\.0\.mlp\.scale_inv"):
        load_checkpoint(path)


def test_out_of_range_expert(qwen3_next_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen3_next_checkpoint.path)
    rewrite(path / "model.safetensors",
            lambda t: t.update({"model.layers.0.mlp.experts.9.up_proj.weight": torch.zeros(32, 64)}))
    with pytest.raises(CheckpointError, match=r"experts\.9\.up_proj"):
        load_checkpoint(path)


def test_tensor_given_twice(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    rewrite(path / "model.safetensors",
            lambda t: t.update({"model.language_model.norm.weight": t["model.norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"norm\.weight is given twice"):
        load_checkpoint(path)


def test_experts_given_fused_and_per_expert(qwen3_next_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen3_next_checkpoint.path)
    fused = qwen3_next_checkpoint.model.model.layers[1].mlp.experts.down_proj.detach().clone()
    rewrite(path / "model.safetensors", lambda t: t.update({"model.layers.1.mlp.experts.down_proj": fused}))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.experts\.down_proj is given twice"):
        load_checkpoint(path)


def test_non_float_tensor(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    rewrite(path / "model.safetensors",
            lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*I32"):
        load_checkpoint(path)


def test_unknown_architecture(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="LlamaForCausalLM"):
        load_checkpoint(path)


@pytest.mark.parametrize("keep", ["data", "header"])
def test_truncated_safetensors(qwen35_checkpoint, copy_checkpoint, keep):
    path = copy_checkpoint(qwen35_checkpoint.path)
    f = path / "model.safetensors"
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        fh.truncate(size - 100 if keep == "data" else 200)
    with pytest.raises(CheckpointError, match=rf"{f}.*truncated"):
        load_checkpoint(path)


def test_corrupt_data_caught_when_reading(qwen35_checkpoint, copy_checkpoint, monkeypatch):
    """A file whose header checks out but which safetensors refuses is named too."""
    import safetensors

    path = copy_checkpoint(qwen35_checkpoint.path)

    def broken(*args, **kwargs):
        raise safetensors.SafetensorError("simulated deserialization failure")

    monkeypatch.setattr(safetensors, "safe_open", broken)
    with pytest.raises(CheckpointError, match=rf"{path / 'model.safetensors'}.*simulated"):
        load_checkpoint(path)


def test_missing_shard(checkpoint_factory, copy_checkpoint):
    path = copy_checkpoint(checkpoint_factory("qwen3_5", max_shard_size="60KB").path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (path / shard).unlink()
    with pytest.raises(CheckpointError, match=rf"{shard}.*missing"):
        load_checkpoint(path)


def test_index_names_tensor_not_in_shard(checkpoint_factory, copy_checkpoint):
    path = copy_checkpoint(checkpoint_factory("qwen3_5", max_shard_size="60KB").path)
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = index["weight_map"]["model.norm.weight"]
    rewrite(path / shard, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(CheckpointError, match=rf"{shard}: tensor model\.norm\.weight listed in"):
        load_checkpoint(path)
    del index["weight_map"]["model.norm.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing tensors: norm\.weight .*shards listed by"):
        load_checkpoint(path)


@pytest.mark.parametrize("which", ["config.json", "model.safetensors.index.json"])
def test_corrupt_json(checkpoint_factory, copy_checkpoint, which):
    path = copy_checkpoint(checkpoint_factory("qwen3_5", max_shard_size="60KB").path)
    (path / which).write_text('{"architectures": [')
    with pytest.raises(CheckpointError, match=rf"{which}: not valid"):
        load_checkpoint(path)


def test_missing_config(qwen35_checkpoint, copy_checkpoint):
    path = copy_checkpoint(qwen35_checkpoint.path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(path)


def test_no_weights(qwen35_checkpoint, tmp_path):
    (tmp_path / "config.json").write_text((qwen35_checkpoint.path / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights"):
        load_checkpoint(tmp_path)


def test_bad_device(qwen35_checkpoint):
    with pytest.raises(ValueError, match="--device"):
        load_checkpoint(qwen35_checkpoint.path, device="nonsense")


def test_language_model_only_runtime_takes_no_images(multimodal_checkpoint, tmp_path, caplog):
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    config = EngineConfig(model=(str(multimodal_checkpoint.path),), device="cpu", tierd_endpoint="off",
                          runtime_dir=str(tmp_path), kv_pool_tokens=256, decode_lanes=2, language_model_only=True)
    with caplog.at_level("INFO", logger="ignis.engine"):
        runtime = load_runtime(config, "m", str(multimodal_checkpoint.path))
    try:
        assert runtime.scheduler.config.image_token_id is None  # an image request is refused by the scheduler
        assert "vision tower of m not loaded (--language-model-only)" in caplog.text
    finally:
        runtime.close()


def test_generation_config_end_ids_join_the_configs(qwen35_checkpoint, copy_checkpoint, caplog):
    """Qwen3.5 names <|im_end|> in config.json and adds <|endoftext|> in generation_config.json: both end a
    choice (vLLM stops on both); a generation config that cannot be read adds nothing."""
    path = copy_checkpoint(qwen35_checkpoint.path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": 9}))
    base = load_config(path).eos_token_ids
    assert base == (9,)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 11], "top_k": 20}))
    assert load_config(path).eos_token_ids == (9, 11)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert load_config(path).eos_token_ids == (9, 7)
    for bad in ("{not json", json.dumps({"eos_token_id": ["x", -1]}), json.dumps([1, 2])):
        (path / "generation_config.json").write_text(bad)
        assert load_config(path).eos_token_ids == base
    # a malformed entry is named: the model would not stop where its checkpoint says
    caplog.clear()
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["11", 7]}))
    assert load_config(path).eos_token_ids == (9, 7)
    assert "eos_token_id entries ['11'] are not token ids" in caplog.text


def test_drafter_flags_with_no_drafter_to_shape_are_named(qwen35_checkpoint, tmp_path, caplog):
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    config = EngineConfig(model=(str(qwen35_checkpoint.path),), device="cpu", tierd_endpoint="off",
                          runtime_dir=str(tmp_path), kv_pool_tokens=256, decode_lanes=2, prompt_lookup_max=3,
                          speculative_disable_by_batch_size=4)
    with caplog.at_level("INFO", logger="ignis.engine"):
        runtime = load_runtime(config, "m", str(qwen35_checkpoint.path))
    runtime.close()
    assert ("--prompt-lookup-max, --speculative-disable-by-batch-size given but not used: no speculative decoding"
            in caplog.text)
