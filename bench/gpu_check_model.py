"""gpu_check's ``model`` section: model equivalence of a small random Qwen3.5 on the device.

HybridModel on the Triton forms against the same model on the torch twins, in
bf16 and fp32, over mixed decode + prefill batches; where transformers is
importable, also against transformers' forward (chunked prefill then decode
steps against one full forward). Error is ``max|ours - ref| / max|ref|`` over
the logits.

Imported by ``bench/gpu_check.py`` once it has set ``TRITON_INTERPRET`` and called ``use_checkout()``.
"""

from __future__ import annotations

import time

import torch

from gpu_check_report import Report
from gpu_check_shapes import PAGE, Shapes


def max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def _perturb_norms(model) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_((torch.randn(p.shape, generator=gen) * 0.2).to(p.device, p.dtype))


def _run_ours(model, ops, dtype, device, chunks_per_step):
    from ignis.engine.forward_batch import ForwardBatch
    from ignis.engine.models.state import ModelState

    model.ops = ops
    state = ModelState.allocate(model.cfg, num_pages=32, lanes=4, dtype=dtype, device=device, fill=float("nan"))
    return [model(ForwardBatch.build(chunks, device), state, all_logits=True) for chunks in chunks_per_step]


def run_model(rep: Report, shapes: Shapes, device: str, deadline: float) -> float:
    """Largest bf16 error over the comparisons (NaN when none ran)."""
    from ignis.engine.forward_batch import SeqChunk
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.hybrid import HybridModel
    from ignis.kernels.backend import REFERENCE, triton_ops

    cfg = config_from_dict(shapes.model)
    torch.manual_seed(0)
    base = HybridModel(cfg).eval()
    _perturb_norms(base)
    n1, n2, steps = shapes.model_tokens
    ids = torch.randint(0, cfg.vocab_size, (n1 + n2 + steps,), generator=torch.Generator().manual_seed(2)).tolist()
    pages_a = [9, 3, 17, 5, 30, 1, 12, 22][: (len(ids) + PAGE - 1) // PAGE]
    pages_b = [7, 26]
    # one sequence chunked then decoded, while a second one runs beside it
    mixed = [[SeqChunk(ids[:n1], 0, pages_a, 2), SeqChunk(ids[:5], 0, pages_b, 0)],
             [SeqChunk(ids[5:6], 5, pages_b, 0), SeqChunk(ids[n1:n1 + n2], n1, pages_a, 2)]]
    mixed += [[SeqChunk([ids[p]], p, pages_a, 2), SeqChunk([ids[6 + i]], 6 + i, pages_b, 0)]
              for i, p in enumerate(range(n1 + n2, len(ids)))]
    worst = float("nan")
    tols = {torch.bfloat16: 5e-2, torch.float32: 1e-4}
    for dtype in (torch.bfloat16, torch.float32):
        if time.monotonic() > deadline:
            rep.say(f"model: past the deadline, skipped {dtype}")
            continue
        model = HybridModel(cfg).to(device=device, dtype=dtype).eval()
        model.load_state_dict(base.state_dict())
        model.rotary.inv_freq = model.rotary.frequencies(device)
        want = _run_ours(model, REFERENCE, dtype, device, mixed)
        got = _run_ours(model, triton_ops(), dtype, device, mixed)
        err = max(max_rel(g, w) for g, w in zip(got, want))
        _model_row(rep, f"triton vs twins, {dtype}", err, tols[dtype])
        if dtype == torch.bfloat16:
            worst = err if worst != worst else max(worst, err)
        hf_err = _versus_transformers(rep, cfg, base, got, ids, n1, n2, dtype, device, tols[dtype])
        if hf_err is not None and dtype == torch.bfloat16:
            worst = max(worst, hf_err)
    return worst


def _model_row(rep: Report, what: str, err: float, tol: float) -> None:
    ok = err < tol
    rep.say(f"model: {what}: max rel err {err:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}")
    if not ok:
        rep.failures.append(f"model {what}")


def _versus_transformers(rep, cfg, base, got, ids, n1, n2, dtype, device, tol):
    """Sequence A's logits from the mixed run against transformers' single forward."""
    try:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    except ImportError:
        rep.say("model: transformers is not importable here; skipped that comparison")
        return None
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**hf_config(cfg))).eval()
    hf.load_state_dict({("model." + k if k != "lm_head.weight" else k): v for k, v in base.state_dict().items()})
    hf = hf.to(device=device, dtype=dtype)
    with torch.no_grad():
        want = hf(torch.tensor([ids], device=device), use_cache=False).logits[0]
    # sequence A is row 0 of step 0 (n1 tokens), the last n2 rows of step 1, row 0 of each decode step
    ours = torch.cat([got[0][:n1], got[1][-n2:]] + [g[:1] for g in got[2:]])
    err = max_rel(ours, want)
    _model_row(rep, f"triton vs transformers, {dtype}", err, tol)
    return err


def hf_config(cfg) -> dict:
    """transformers' Qwen3_5TextConfig arguments for our ModelConfig."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim}
    return {"rope_parameters": rope, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.conv_kernel, "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings}
