"""``ignis inspect``: what a model is made of and what one KV pool holds for it.

Reads ``config.json`` and, when the directory has weights, the safetensors
headers only (never a tensor, never torch), so it works on a config-only
directory and on a checkpoint far larger than memory. Prints the layers by
kind, the MoE shape, KV bytes per token in both formats, the per-sequence
recurrent and conv state, the vocabulary's share (embedding table, LM head,
one round's logits at ``--lanes`` rows, the sampler's host scratch), the
weight bytes and the largest context a pool of ``--pool-bytes`` holds.
``--json`` prints the same figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from ignis.engine.config import EngineConfig
from ignis.engine.memory_plan import embedding_bytes, lm_head_bytes, logits_bytes, sampler_workspace_bytes
from ignis.engine.models.config import (DTYPE_BYTES, KV_FORMATS, PAGE_TOKENS, CheckpointError, ModelConfig,
                                        load_config)
from ignis.engine.models.fp8_blocks import FP8_DTYPE, SCALE_SUFFIX
from ignis.engine.models.weights_spec import classify, expected_tensors, expected_weight_bytes
from ignis.shared.hf_cache import resolve_checkpoint

DEFAULT_POOL_BYTES = 16 * 2**30
DEFAULT_LANES = EngineConfig().decode_lanes

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``16G``, ``512M``, ``1.5GiB``, ``17179869184`` -> bytes (binary units)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(
            f"--pool-bytes: cannot read {text!r} (a byte count, or a number with K, M, G or T)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--pool-bytes: must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``--lanes``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def human(n: int) -> str:
    """Bytes in binary units: ``144 MiB``, ``9 KiB``, ``1.5 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B"


def exact(n: int) -> str:
    """Human units plus the exact byte count."""
    return f"{human(n)} ({n:,} bytes)" if n >= 1024 else f"{n:,} bytes"


def count(n: int) -> str:
    """A parameter count: ``26.90 B``, ``134.03 K``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def layer_pattern(types: tuple[str, ...]) -> str:
    """The smallest repeating period of the layer kinds, as runs: ``[3 linear_attention + 1 full_attention] x 16``."""
    n = len(types)
    period = next(p for p in range(1, n + 1) if n % p == 0 and types == types[:p] * (n // p))
    if period == 1:
        return f"all {types[0]}" if n else "no layers"
    runs: list[list] = []
    for t in types[:period]:
        if runs and runs[-1][1] == t:
            runs[-1][0] += 1
        else:
            runs.append([1, t])
    body = " + ".join(f"{count} {kind}" for count, kind in runs)
    return f"[{body}] x {n // period}" if n // period > 1 else body


# ----- figures -----------------------------------------------------------------
def _parameters(cfg: ModelConfig) -> tuple[int, int]:
    """(total, active per token) parameter counts of the text model."""
    total = experts = 0
    for name, shape in expected_tensors(cfg).items():
        n = math.prod(shape)
        total += n
        if ".mlp.experts." in name:
            experts += n
    active = total - experts
    if experts:
        active += experts * cfg.num_experts_per_tok // cfg.num_experts
    return total, active


def _weights(model_dir: Path, cfg: ModelConfig) -> dict:
    from ignis.engine.models.loader import find_weight_files, read_inventory

    try:
        files = find_weight_files(model_dir)
        if files is None:
            return {"source": "estimated from config", "bytes": expected_weight_bytes(cfg), "dtype": cfg.dtype}
        inventory = read_inventory(files)
    except CheckpointError as exc:
        return {"source": "safetensors headers", "error": str(exc)}
    text = loaded = 0
    set_aside: dict[str, int] = {}
    dtypes: dict[str, int] = {}
    config_bytes = DTYPE_BYTES[cfg.dtype]
    for name, (_, entry) in inventory.items():
        if name.endswith(SCALE_SUFFIX):  # an fp8 weight's block scales: stored, not served
            text += entry.nbytes
            continue
        kind = classify(name)
        if kind.kind in ("vision", "mtp"):
            set_aside[kind.kind] = set_aside.get(kind.kind, 0) + entry.nbytes
            continue
        if kind.canonical == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        text += entry.nbytes
        dtypes[entry.dtype] = dtypes.get(entry.dtype, 0) + entry.nbytes
        loaded += math.prod(entry.shape) * config_bytes if entry.dtype == FP8_DTYPE else entry.nbytes
    out = {"source": "safetensors headers", "bytes": text, "files": len(files.files),
           "stored_dtypes": sorted(dtypes), "set_aside_bytes": set_aside}
    if cfg.fp8_block is not None:  # dequantized at load: served at the config dtype
        out["fp8_block"] = list(cfg.fp8_block)
        out["loaded_bytes"] = loaded
    return out


def _vocabulary(cfg: ModelConfig, lanes: int) -> dict:
    """The vocabulary's memory at the config dtype: weights, one round's logits, the sampler's host scratch."""
    return {"vocab_size": cfg.vocab_size, "dtype": cfg.dtype, "tied": cfg.tie_word_embeddings,
            "embedding_bytes": embedding_bytes(cfg, cfg.dtype), "lm_head_bytes": lm_head_bytes(cfg, cfg.dtype),
            "lanes": lanes, "logits_bytes": logits_bytes(cfg, cfg.dtype, lanes),
            "sampler_workspace_bytes": sampler_workspace_bytes(cfg.vocab_size)}


def build_report(model_dir: Path, cfg: ModelConfig, pool_bytes: int, lanes: int = DEFAULT_LANES) -> dict:
    """Every figure ``ignis inspect`` shows, as plain JSON-ready values."""
    total, active = _parameters(cfg)
    moe_layers = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
    mlp = {"kind": "dense", "intermediate_size": cfg.intermediate_size}
    if moe_layers:
        mlp = {"kind": "moe", "moe_layers": len(moe_layers), "num_experts": cfg.num_experts,
               "experts_per_token": cfg.num_experts_per_tok, "moe_intermediate_size": cfg.moe_intermediate_size,
               "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
               "dense_layers": cfg.num_layers - len(moe_layers), "intermediate_size": cfg.intermediate_size}
    per_token = {fmt: cfg.kv_bytes_per_token(fmt) for fmt in KV_FORMATS}
    return {
        "model_dir": str(model_dir),
        "architecture": cfg.architecture,
        "family": cfg.family,
        "multimodal": cfg.multimodal,
        "dtype": cfg.dtype,
        "layers": {"total": cfg.num_layers, "linear_attention": len(cfg.linear_layers),
                   "full_attention": len(cfg.full_layers), "pattern": layer_pattern(cfg.layer_types),
                   "full_attention_layers": cfg.full_layers},
        "attention": {"num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                      "rotary_dim": cfg.rotary_dim},
        "linear_attention": {"num_key_heads": cfg.linear_num_key_heads,
                             "num_value_heads": cfg.linear_num_value_heads,
                             "key_head_dim": cfg.linear_key_head_dim,
                             "value_head_dim": cfg.linear_value_head_dim, "conv_kernel": cfg.conv_kernel},
        "mlp": mlp,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "parameters": total,
        "active_parameters": active,
        "kv_bytes_per_token": per_token,
        "recurrent_state_bytes": cfg.recurrent_state_bytes(),
        "conv_state_bytes": cfg.conv_state_bytes(4),
        "vocabulary": _vocabulary(cfg, lanes),
        "weights": _weights(model_dir, cfg),
        "pool": {"bytes": pool_bytes, "page_tokens": PAGE_TOKENS,
                 "pages": {f: (pool_bytes // (b * PAGE_TOKENS) if b else 0) for f, b in per_token.items()},
                 "max_context_tokens": {f: cfg.max_context_for_pool(pool_bytes, f) for f in KV_FORMATS}},
    }


# ----- text rendering --------------------------------------------------------------
def render(r: dict) -> str:
    """The report as aligned ``label  value`` lines."""
    rows: list[tuple[str, str]] = []

    def add(label: str, value: str = "") -> None:
        rows.append((label, value))

    mm = "; multimodal, vision tower not served" if r["multimodal"] else ""
    add("model", r["model_dir"])
    add("architecture", f"{r['architecture']} (family {r['family']}{mm})")
    lay = r["layers"]
    add("layers", f"{lay['total']}: {lay['linear_attention']} linear_attention"
                  f" + {lay['full_attention']} full_attention")
    add("layer pattern", lay["pattern"])
    a = r["attention"]
    add("full attention", f"{a['num_heads']} query heads, {a['num_kv_heads']} kv heads, head_dim {a['head_dim']}, "
                          f"rotary_dim {a['rotary_dim']}, gated output")
    la = r["linear_attention"]
    add("linear attention", f"{la['num_key_heads']} key heads x {la['key_head_dim']}, {la['num_value_heads']} value "
                            f"heads x {la['value_head_dim']}, conv kernel {la['conv_kernel']}")
    m = r["mlp"]
    if m["kind"] == "moe":
        dense = ""
        if m["dense_layers"]:
            dense = f"; {m['dense_layers']} dense layers (intermediate {m['intermediate_size']})"
        add("mlp", f"MoE on {m['moe_layers']} of {lay['total']} layers: {m['num_experts']} experts, "
                   f"{m['experts_per_token']} per token, expert intermediate {m['moe_intermediate_size']}, "
                   f"shared expert {m['shared_expert_intermediate_size']}{dense}")
    else:
        add("mlp", f"dense, intermediate {m['intermediate_size']}")
    add("hidden / vocab", f"{r['hidden_size']} / {r['vocab_size']}, embeddings "
                          f"{'tied' if r['tie_word_embeddings'] else 'untied'}")
    params = f"{count(r['parameters'])} ({r['parameters']:,})"
    if r["active_parameters"] != r["parameters"]:
        params += f", {count(r['active_parameters'])} active per token (incl. embeddings)"
    add("parameters", params)
    add("config dtype", r["dtype"])
    add("KV bytes per token")
    for fmt, n in r["kv_bytes_per_token"].items():
        add(f"  {fmt}", exact(n))
    add("state per sequence")
    add("  recurrent (fp32)", exact(r["recurrent_state_bytes"]))
    add("  conv (fp32)", exact(r["conv_state_bytes"]))
    v = r["vocabulary"]
    add(f"vocabulary ({v['dtype']})")
    add("  embedding table", exact(v["embedding_bytes"]))
    add("  LM head", "tied: the embedding table" if v["tied"] else exact(v["lm_head_bytes"]))
    widened = "" if v["dtype"] == "float32" else " and their fp32 copy"
    add(f"  logits at {v['lanes']} lanes", f"{exact(v['logits_bytes'])} per round ({v['lanes']} rows x "
                                           f"{v['vocab_size']:,} in {v['dtype']}{widened})")
    add("  sampler scratch", f"{exact(v['sampler_workspace_bytes'])} host memory")
    w = r["weights"]
    if "error" in w:
        add("weights", f"unreadable: {w['error']}")
    elif w["source"] == "estimated from config":
        add("weights", f"{exact(w['bytes'])} at {w['dtype']}, estimated from config (no weight files)")
    else:
        add("weights", f"{exact(w['bytes'])} {'/'.join(w['stored_dtypes'])}, from safetensors headers "
                       f"({w['files']} file{'s' if w['files'] != 1 else ''})")
        if "loaded_bytes" in w:
            bm, bn = w["fp8_block"]
            add("  served", f"{exact(w['loaded_bytes'])}: fp8 weights in {bm}x{bn} blocks, dequantized to "
                            f"{r['dtype']} at load")
        for kind, n in sorted(w["set_aside_bytes"].items()):
            add(f"  set aside: {kind}", exact(n))
    p = r["pool"]
    add(f"one pool of {human(p['bytes'])}", f"{p['bytes']:,} bytes, {p['page_tokens']}-token pages")
    for fmt, tokens in p["max_context_tokens"].items():
        add(f"  {fmt}", f"{tokens:,} tokens of context ({p['pages'][fmt]:,} pages)")
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{value}".rstrip() for label, value in rows)


# ----- the subcommand ----------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="checkpoint directory (config.json, optionally weights) or a Hugging Face repo id in the "
                             "local hub cache; default: the built-in demo model")
    parser.add_argument("--pool-bytes", metavar="SIZE", type=parse_bytes, default=DEFAULT_POOL_BYTES,
                        help="KV pool size for the context figures: bytes or 16G, 512M, ... (default: 16G)")
    parser.add_argument("--lanes", metavar="N", type=positive_int, default=DEFAULT_LANES,
                        help=f"decode lanes for the per-round logits figure (default: {DEFAULT_LANES}, the engine's)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def _model_dir(arg: str | None) -> Path:
    if arg is not None:
        try:
            return Path(resolve_checkpoint(arg, "--model")[0])  # a cached Hugging Face repo id too
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    try:
        from ignis.shared.demo import DemoModelUnavailable, ensure_demo_model
    except ImportError as exc:
        raise CheckpointError(f"no --model given and the built-in demo model is unavailable ({exc})") from None
    try:
        return Path(ensure_demo_model())
    except DemoModelUnavailable as exc:
        raise CheckpointError(f"no --model given: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        model_dir = _model_dir(args.model)
        cfg = load_config(model_dir)
    except CheckpointError as exc:
        print(f"ignis inspect: error: {exc}", file=sys.stderr)
        return 2
    report = build_report(model_dir, cfg, args.pool_bytes, args.lanes)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if "error" in report["weights"] else 0
