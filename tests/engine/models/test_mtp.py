"""The engine's multi-token-prediction head against the plain-torch reference (fp32), and its loading."""

from __future__ import annotations

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.build import drafter_from_checkpoint, load_model
from tests.engine.checkpoints import TINY_TEXT
from tests.engine.mtp_fit import target_hidden
from tests.engine.mtp_reference import reference_from_checkpoint, text_config

TOL = 1e-5


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_head_matches_reference_prefill_then_steps(checkpoint_factory, family):
    ckpt = checkpoint_factory(family, mtp="full")
    model, loaded = load_model(ckpt.path)
    assert loaded.has_drafter and loaded.drafter_layers == 1 and "mtp" not in loaded.set_aside
    head = drafter_from_checkpoint(loaded)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, TINY_TEXT["vocab_size"], (21,), generator=gen).tolist()
    hidden = target_hidden(model, ids)
    n = len(ids) - 1  # row p: hidden of position p, token p + 1
    ref = reference_from_checkpoint(ckpt.path, family, text_config(family))
    with torch.no_grad():
        emb = model.embed_tokens.weight[torch.tensor(ids[1:])]
        want = ref(emb, hidden[:n], torch.arange(n))
        want_logits = want @ model.head_weight().T

    pages = [2, 0, 3]  # out of order: the head reads its KV through the page table
    kv = torch.full((2, 4, 64, TINY_TEXT["num_key_value_heads"], TINY_TEXT["head_dim"]), float("nan"))
    split = 13
    got = [head(model, ForwardBatch.build([SeqChunk(ids[1:split + 1], 0, pages, 0)]), hidden[:split], kv)]
    for p in range(split, n):  # then one row at a time, reading the earlier rows' KV
        got.append(head(model, ForwardBatch.build([SeqChunk([ids[p + 1]], p, pages, 0)]), hidden[p:p + 1], kv))
    got = torch.cat(got)
    assert rel_err(got, want) < TOL
    assert rel_err(head.logits(model, got), want_logits) < TOL


def test_partial_mtp_weights_are_set_aside_with_a_reason(checkpoint_factory):
    loaded = load_model(checkpoint_factory("qwen3_5", mtp=True).path)[1]
    assert not loaded.has_drafter and drafter_from_checkpoint(loaded) is None
    assert loaded.set_aside["mtp"] == ["mtp.fc.weight", "mtp.norm.weight"]
    assert "missing mtp.pre_fc_norm_embedding.weight" in loaded.drafter_note


def test_checkpoint_without_mtp_has_no_drafter(checkpoint_factory):
    loaded = load_model(checkpoint_factory("qwen3_next").path)[1]
    assert not loaded.has_drafter and loaded.drafter_note == "the checkpoint has no mtp.* weights"


def test_drafter_leaves_the_structural_hash_alone(checkpoint_factory):
    plain = load_model(checkpoint_factory("qwen3_5").path)[1]
    with_head = load_model(checkpoint_factory("qwen3_5", mtp="full").path)[1]
    assert plain.structural_hash == with_head.structural_hash


def test_drafter_tensors_stay_on_disk_unless_asked(checkpoint_factory):
    loaded = load_model(checkpoint_factory("qwen3_next", mtp="full").path, drafter=False)[1]
    assert loaded.has_drafter and not loaded.drafter_tensors
    with pytest.raises(ValueError, match="not read"):
        drafter_from_checkpoint(loaded)


def test_misshapen_head_is_set_aside(checkpoint_factory, copy_checkpoint):
    import json

    path = copy_checkpoint(checkpoint_factory("qwen3_5", mtp="full").path)
    config = json.loads((path / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 2  # the files hold one layer
    (path / "config.json").write_text(json.dumps(config))
    loaded = load_model(path)[1]
    assert not loaded.has_drafter and "missing mtp.layers.1." in loaded.drafter_note


def test_startup_log_says_the_drafter_is_available(checkpoint_factory, caplog, tmp_path):
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    path = checkpoint_factory("qwen3_next", mtp="full").path
    config = EngineConfig(model=str(path), device="cpu", tierd_endpoint="off", runtime_dir=str(tmp_path),
                          kv_pool_tokens=256, decode_lanes=2)
    with caplog.at_level("INFO", logger="ignis.engine"):
        runtime = load_runtime(config, "m", str(path))
    runtime.close()
    assert "multi-token-prediction drafter available: a drafter of 1 multi-token-prediction layer(s)" in caplog.text
    assert "not used (--speculative-tokens K drafts with it)" in caplog.text
    caplog.clear()
    lookup = EngineConfig(model=str(path), device="cpu", tierd_endpoint="off", runtime_dir=str(tmp_path),
                          kv_pool_tokens=256, decode_lanes=2, speculative_method="ngram", speculative_tokens=3)
    with caplog.at_level("INFO", logger="ignis.engine"):
        load_runtime(lookup, "m", str(path)).close()
    # prompt lookup drafts: the head's line does not say speculation is off
    assert "prompt lookup drafts up to 3 tokens" in caplog.text and "not used (prompt lookup drafts instead)" in caplog.text
