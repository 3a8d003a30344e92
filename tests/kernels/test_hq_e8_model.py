"""The whole model on an hq-e8-2b pool: Triton forms against the torch twins.

A tiny random Qwen3.5 (one linear and one full-attention layer, 2 kv heads
of 32, window 8) runs a prefill step, then a step mixing a decode, a chunk
longer than the window continuing a context, and a fresh sequence; logits
agree to a relative RMS of 1e-4 in fp32 (measured ~1e-7: the encoders pick
the same codes, the attention differs in rounding only).
"""

from __future__ import annotations

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.kernels.backend import REFERENCE, triton_ops
from tests.kernels.conftest import assert_close

TINY = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
}


def run_steps(model, ops, device) -> list[torch.Tensor]:
    model.ops = ops
    state = ModelState.allocate(model.cfg, num_pages=8, lanes=4, dtype=torch.float32, device=device,
                                fill=float("nan"), kv_format="hq-e8-2b", exact_window=8)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (100,), generator=gen).tolist()
    steps = [
        [SeqChunk(ids[:70], 0, [5, 2], 2), SeqChunk(ids[70:73], 0, [7], 0)],
        [SeqChunk(ids[73:74], 70, [5, 2], 2), SeqChunk(ids[74:86], 3, [7], 0), SeqChunk(ids[86:99], 0, [1], 3)],
    ]
    for lane in (0, 2, 3):
        state.reset_lane(lane)
    return [model(ForwardBatch.build(chunks, device), state, all_logits=True) for chunks in steps]


def test_model_on_triton_forms_matches_twins(device):
    torch.manual_seed(0)
    model = HybridModel(config_from_dict(TINY)).to(device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    want = run_steps(model, REFERENCE, device)
    got = run_steps(model, triton_ops(), device)
    for i, (g, w) in enumerate(zip(got, want)):
        assert bool(torch.isfinite(g).all())
        assert_close(g, w, 1e-4, f"hq-e8-2b model step {i}")
