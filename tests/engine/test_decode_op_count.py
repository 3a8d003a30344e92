"""How many kernels one decode step launches, per layer, on a 27B-shaped Qwen3.5.

A decode step is launch-bound: its cost is roughly the number of kernels it
issues. The model runs on the META device (nothing is computed, so this is
fast) with every ``Ops`` kernel replaced by a stub that records one launch and
returns an empty tensor of the op's output shape; a ``TorchDispatchMode``
records every aten op the model itself dispatches.

Counted: every aten call except metadata-only views (``VIEW_OPS``) and
allocations (``ALLOC_OPS``), plus one per ``Ops`` call. Each counted call is
one kernel launch on a GPU (a matmul is one cuBLAS launch).

Per-layer counts come from differences between models of one, two and
three layers (``linear``, ``linear, linear``, ``linear, full``): the
embedding, the rotary tables and the final add are counted once, not per
layer. With 4 sequences, one token each:

                     before fusion (was)   fused   budget
    linear_attention        57               15      17
    full_attention          69               15      17
    whole step (64 layers)  3861              973

Fused: each residual add with the next norm, the q/k norms with the rotary,
the attention's sigmoid gate, the delta rule's beta/g gating and gated norm,
SwiGLU's silu * up (kernels/fused); pure-decode batches call the decode
kernels without scattering into a shared output. Of the 15 left, 8 (linear)
and 7 (full) are matmuls. ``BUDGET`` is the fused count plus a margin of 2.

The qwen3_next family is not counted here: its MoE block reads the routing
back to the host (``bincount(...).tolist()``), which the META device cannot do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.checkpoint_shapes import QWEN35_27B
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.kernels.backend import REFERENCE, Ops

META = torch.device("meta")
DTYPE = torch.bfloat16
DECODES = 4


# launches per layer with DECODES sequences, one token each
BUDGET = {"linear_attention": 17, "full_attention": 17}

VIEW_OPS = {
    "view", "_unsafe_view", "split", "split_with_sizes", "slice", "select", "unsqueeze",
    "squeeze", "expand", "t", "transpose", "permute", "as_strided", "detach", "alias", "unbind",
    "chunk", "narrow", "_reshape_alias",
}
ALLOC_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# ops that launch a copy only when they cannot return their input or a view of it
MAYBE_COPY = {"to", "type_as", "reshape", "contiguous", "flatten"}


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


class LaunchCount(TorchDispatchMode):
    """Counts aten calls by name; views, allocations and casts to the same dtype are not launches."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self.muted = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if name in MAYBE_COPY and _same_storage(out, args[0]):
            return out
        if not self.muted and name not in VIEW_OPS and name not in ALLOC_OPS:
            self.counts[name] += 1
        return out


def _like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device)


# op name -> output of the op given its arguments (shapes and dtypes only)
OUTPUTS = {
    "write_kv": lambda *a: None,
    "hq_write_kv": lambda *a: None,
    "hq_window_write": lambda *a: None,
    "decode_attention": lambda q, *a: _like(q),
    "hq_decode_attention": lambda q, *a: _like(q),
    "recurrent_gated_delta_rule": lambda q, k, v, *a: _like(v),
    "causal_conv1d_update": lambda x, *a: _like(x),
    "rms_norm": lambda x, *a: _like(x),
    "add_rms_norm": lambda x, residual, *a: (_like(x), _like(x)),
    "gated_rms_norm": lambda x, *a: _like(x),
    "silu_mul": lambda gate, up: _like(gate),
    "sigmoid_mul": lambda x, gate: _like(x),
    "gdn_gating": lambda a, b, *rest: (_like(a, torch.float32), _like(b)),
    "norm_rotary": lambda x, *a: _like(x),
}


def counting_ops(mode: LaunchCount) -> Ops:
    """``Ops`` whose every kernel records one launch and returns an empty output."""

    def stub(name):
        def call(*args, **kwargs):
            if name not in OUTPUTS:
                raise AssertionError(f"a decode step called ops.{name}, which this test has no output for")
            mode.counts[f"ops.{name}"] += 1
            mode.muted = True
            try:
                return OUTPUTS[name](*args, **kwargs)
            finally:
                mode.muted = False
        return call

    return Ops(**{f.name: stub(f.name) for f in fields(Ops) if f.name not in ("name", "fallbacks")}, name="count")


def count_decode(raw: dict, layer_types: list[str]) -> Counter:
    """Launches of one decode forward (DECODES sequences, one token each) of ``layer_types``."""
    cfg = config_from_dict({**raw, "num_hidden_layers": len(layer_types), "layer_types": layer_types})
    with META:
        model = HybridModel(cfg).to(DTYPE).eval()
    full, lin = len(cfg.full_layers), len(cfg.linear_layers)
    pages, lanes = 2 * DECODES, DECODES
    state = ModelState(
        kv=torch.empty((full, 2, pages, 64, cfg.num_kv_heads, cfg.head_dim), dtype=DTYPE, device=META),
        ssm=torch.empty((lin, lanes, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                         cfg.linear_value_head_dim), dtype=torch.float32, device=META),
        conv=torch.empty((lin, lanes, cfg.conv_dim, cfg.conv_kernel - 1), dtype=DTYPE, device=META),
    )
    batch = ForwardBatch.build([SeqChunk([7 + b], 100 + b, [2 * b, 2 * b + 1], b) for b in range(DECODES)], META)
    assert batch.num_decodes == DECODES
    mode = LaunchCount()
    model.ops = counting_ops(mode)
    with mode:
        logits = model(batch, state)
    assert logits.shape == (DECODES, cfg.vocab_size)
    return mode.counts


def per_layer(raw: dict) -> dict[str, Counter]:
    one = count_decode(raw, ["linear_attention"])
    two = count_decode(raw, ["linear_attention", "linear_attention"])
    mixed = count_decode(raw, ["linear_attention", "full_attention"])
    return {"linear_attention": two - one, "full_attention": mixed - one, "one_layer": one}


def breakdown(counts: Counter) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.most_common())


def check(raw: dict, budget: dict[str, int], what: str) -> dict[str, Counter]:
    layers = per_layer(raw)
    for kind, limit in budget.items():
        total = sum(layers[kind].values())
        print(f"{what} {kind}: {total} launches per layer: {breakdown(layers[kind])}")
        assert total <= limit, (f"{what}: a {kind} layer launches {total} kernels per decode step "
                                f"(budget {limit}): {breakdown(layers[kind])}")
    return layers


def test_qwen35_27b_decode_launches_per_layer():
    layers = check(QWEN35_27B, BUDGET, "qwen3.5-27B")
    cfg = config_from_dict(QWEN35_27B)
    lin, full = (sum(layers[kind].values()) for kind in ("linear_attention", "full_attention"))
    once = sum(layers["one_layer"].values()) - lin  # embedding, rotary tables, final add and head
    step = once + len(cfg.linear_layers) * lin + len(cfg.full_layers) * full
    whole = sum(count_decode(QWEN35_27B, list(cfg.layer_types)).values())
    print(f"qwen3.5-27B: {whole} launches per decode step ({cfg.num_layers} layers)")
    assert whole == step, f"the whole model launches {whole}, its layers add up to {step}"


def test_every_op_has_a_stub_output():
    """A new ``Ops`` field a decode step can call needs an entry in OUTPUTS."""
    prefill_only = {"prefill_attention", "chunk_gated_delta_rule", "causal_conv1d_varlen",
                    "hq_prefill_attention"}
    missing = [f.name for f in fields(REFERENCE)
               if f.name not in ("name", "fallbacks") and f.name not in OUTPUTS and f.name not in prefill_only]
    assert not missing, f"no stub output for {missing}"
