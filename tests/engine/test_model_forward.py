"""Our hybrid forward against transformers' forward on tiny random checkpoints.

Error is ``max|ours - ref| / max|ref|`` over the logits compared. In fp32 it
measures about 3e-7 on these models; the bound is 1e-5. bf16 runs are held
to 5e-2 against transformers in bf16, and against the fp32 reference to no
more than twice transformers' own bf16 error plus 1e-2 (measured: 6e-3 and
2e-2 on the dense and MoE models; transformers' own: about the same).
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from tests.engine.checkpoints import make_checkpoint

FP32_TOL = 1e-5
BF16_TOL = 5e-2
VOCAB = 128


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    """Checkpoints whose norm weights are random too, so every weight matters."""
    root = tmp_path_factory.mktemp("perturbed")
    cache = {}

    def get(family: str, **kwargs):
        kwargs = {"layer_pattern": "interval4", "tie": False, **kwargs}
        key = (family, repr(sorted(kwargs.items())))
        if key not in cache:
            ckpt = make_checkpoint(root, family, **kwargs)
            gen = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for name, p in ckpt.model.named_parameters():
                    if "norm" in name:
                        p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.2)
            ckpt.model.save_pretrained(ckpt.path)
            cache[key] = ckpt
        return cache[key]

    return get


def reference_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]


def shuffled_pages(n: int, seed: int, total: int = 64) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(total, generator=gen)[:n].tolist()


def run_chunked(model, state, ids, sizes, pages, lane=0) -> torch.Tensor:
    """Prefill ``ids`` in chunks of ``sizes`` (sizes repeat), all-token logits."""
    state.reset_lane(lane)
    out, pos, i = [], 0, 0
    while pos < len(ids):
        n = sizes[i % len(sizes)]
        chunk = ids[pos:pos + n]
        batch = ForwardBatch.build([SeqChunk(chunk, pos, pages, lane)])
        out.append(model(batch, state, all_logits=True))
        pos += len(chunk)
        i += 1
    return torch.cat(out)


def new_state(model, pages=64, lanes=8, dtype=torch.float32):
    return ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=dtype, fill=float("nan"))


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("pattern", ["interval4", "interval2", "all_full"])
def test_one_shot_prefill_matches(perturbed, family, pattern):
    ckpt = perturbed(family, layer_pattern=pattern)
    model, _ = load_model(ckpt.path)
    ids = prompt(200, 0)
    got = run_chunked(model, new_state(model), ids, [len(ids)], shuffled_pages(4, 0))
    err = rel_err(got, reference_logits(ckpt.model, ids))
    print(f"{family}/{pattern} one-shot rel err {err:.2e}")
    assert err < FP32_TOL


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("sizes", [[1], [7], [64], [100], [3, 61, 1, 64]])
def test_chunked_prefill_matches(perturbed, family, sizes):
    ckpt = perturbed(family)
    model, _ = load_model(ckpt.path)
    ids = prompt(200, 1)
    want = reference_logits(ckpt.model, ids)
    got = run_chunked(model, new_state(model), ids, sizes, shuffled_pages(4, 1))
    err = rel_err(got, want)
    print(f"{family} chunks {sizes} rel err {err:.2e}")
    assert err < FP32_TOL


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_prefill_then_32_decode_steps(perturbed, family):
    ckpt = perturbed(family)
    model, _ = load_model(ckpt.path)
    ids = prompt(150, 2)
    n_prompt = 118
    want = reference_logits(ckpt.model, ids)
    state = new_state(model)
    pages = shuffled_pages(3, 2)
    got = [run_chunked(model, state, ids[:n_prompt], [n_prompt], pages)[-1:]]
    for pos in range(n_prompt, n_prompt + 32):
        batch = ForwardBatch.build([SeqChunk([ids[pos]], pos, pages, 0)])
        assert batch.num_decodes == 1
        got.append(model(batch, state))
    got = torch.cat(got)
    err = rel_err(got, want[n_prompt - 1:n_prompt + 32])
    print(f"{family} decode rel err {err:.2e}")
    assert err < FP32_TOL


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_four_sequences_in_one_batch(perturbed, family):
    """Two decoding sequences and two prefill chunks (one fresh, one continuing) in one forward."""
    ckpt = perturbed(family)
    model, _ = load_model(ckpt.path)
    state = new_state(model)
    seqs = [prompt(n, 10 + i) for i, n in enumerate([90, 201, 130, 57])]
    want = [reference_logits(ckpt.model, s) for s in seqs]
    pages = [shuffled_pages(4, 20 + i, total=64)[:4] for i in range(4)]
    # make the four page tables disjoint
    pool = torch.randperm(64, generator=torch.Generator().manual_seed(5)).tolist()
    pages = [pool[i * 4:(i + 1) * 4] for i in range(4)]
    # sequences 0 and 1 are prefilled up to their last token, then decode it
    run_chunked(model, state, seqs[0][:-1], [89], pages[0], lane=3)
    run_chunked(model, state, seqs[1][:-1], [50], pages[1], lane=1)
    # sequence 2 has a first part already prefilled; sequence 3 is fresh
    run_chunked(model, state, seqs[2][:70], [70], pages[2], lane=5)
    state.reset_lane(0)
    batch = ForwardBatch.build([
        SeqChunk([seqs[0][-1]], 89, pages[0], 3),
        SeqChunk([seqs[1][-1]], 200, pages[1], 1),
        SeqChunk(seqs[2][70:], 70, pages[2], 5),
        SeqChunk(seqs[3], 0, pages[3], 0),
    ])
    assert batch.num_decodes == 2
    logits = model(batch, state)
    for b in range(4):
        err = rel_err(logits[b], want[b][-1])
        print(f"{family} seq {b} rel err {err:.2e}")
        assert err < FP32_TOL


# Miniatures of the released shapes, where they differ from the tiny default: key/value head ratios
# of 3 and 6 (Qwen3.5-27B: 16 key and 48 value heads, 24 query and 4 KV heads), a quarter of each
# head rotated, value and key head dims that differ, more experts per token with and without
# renormalised routing weights, dense layers between MoE ones, a 2-tap conv, 64-wide heads.
SHAPES = {
    "ratios_of_27b": ("qwen3_5", dict(
        num_attention_heads=6, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=24,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25))),
    "ratios_of_next": ("qwen3_next", dict(
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, linear_num_key_heads=1,
        linear_num_value_heads=4, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
        moe_intermediate_size=24, shared_expert_intermediate_size=40)),
    "sparse_step_unnormed": ("qwen3_next", dict(
        norm_topk_prob=False, num_experts=6, num_experts_per_tok=1, decoder_sparse_step=2, mlp_only_layers=[3])),
    "wide_heads_conv2": ("qwen3_5", dict(
        head_dim=64, num_attention_heads=2, num_key_value_heads=2, linear_key_head_dim=64,
        linear_value_head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_conv_kernel_dim=2,
        rope_parameters=dict(rope_type="default", rope_theta=5e5, partial_rotary_factor=1.0))),
    # YaRN as the model cards extend the context (factor 4 past the trained length), the trained length
    # shrunk so the test's positions run past it; and DeepSeek's mscale form of the attention factor
    "yarn_as_the_card_says": ("qwen3_5", dict(
        max_position_embeddings=512, rope_parameters=dict(
            rope_type="yarn", rope_theta=1e7, partial_rotary_factor=0.25, factor=4.0,
            original_max_position_embeddings=64))),
    "yarn_mscale_next": ("qwen3_next", dict(
        max_position_embeddings=256, rope_parameters=dict(
            rope_type="yarn", rope_theta=1e4, partial_rotary_factor=0.5, factor=2.0, beta_fast=16.0,
            original_max_position_embeddings=48, mscale=1.0, mscale_all_dim=0.5))),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_released_shape_ratios_match_in_chunks_and_decode(perturbed, shape):
    """Chunked prefill and decode steps on checkpoints shaped like the released ones."""
    family, overrides = SHAPES[shape]
    ckpt = perturbed(family, config_overrides=overrides)
    model, _ = load_model(ckpt.path)
    ids = prompt(150, 2)
    want = reference_logits(ckpt.model, ids)
    chunked = rel_err(run_chunked(model, new_state(model), ids, [3, 61, 1, 64], shuffled_pages(4, 1)), want)
    state, pages, n_prompt = new_state(model), shuffled_pages(3, 2), 118
    got = [run_chunked(model, state, ids[:n_prompt], [n_prompt], pages)[-1:]]
    for pos in range(n_prompt, len(ids)):
        got.append(model(ForwardBatch.build([SeqChunk([ids[pos]], pos, pages, 0)]), state))
    decode = rel_err(torch.cat(got), want[n_prompt - 1:])
    print(f"{shape}: chunked rel err {chunked:.2e}, decode {decode:.2e}")
    assert chunked < FP32_TOL and decode < FP32_TOL


@pytest.mark.parametrize("tie", [True, False])
def test_tied_embeddings(perturbed, tie):
    ckpt = perturbed("qwen3_5", tie=tie)
    model, loaded = load_model(ckpt.path)
    assert ("lm_head.weight" in loaded.tensors) is (not tie)
    ids = prompt(80, 3)
    got = run_chunked(model, new_state(model), ids, [33], shuffled_pages(2, 3))
    assert rel_err(got, reference_logits(ckpt.model, ids)) < FP32_TOL


def test_multimodal_layout_same_logits(checkpoint_factory):
    ckpt = checkpoint_factory("qwen3_5", multimodal=True, mtp=True)
    model, loaded = load_model(ckpt.path)
    assert loaded.config.multimodal
    ids = prompt(100, 4)
    got = run_chunked(model, new_state(model), ids, [64], shuffled_pages(2, 4))
    assert rel_err(got, reference_logits(ckpt.model, ids)) < FP32_TOL


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_bf16_within_stated_tolerance(perturbed, family):
    ckpt = perturbed(family)
    model, _ = load_model(ckpt.path, dtype="bfloat16")
    ref_bf16 = ckpt.model.to(torch.bfloat16)
    try:
        ids = prompt(130, 6)
        got = run_chunked(model, new_state(model, dtype=torch.bfloat16), ids, [64], shuffled_pages(3, 6))
        want = reference_logits(ref_bf16, ids)
    finally:
        ckpt.model.to(torch.float32)
    want32 = reference_logits(ckpt.model, ids)
    err, err32, ref_err32 = rel_err(got, want), rel_err(got, want32), rel_err(want, want32)
    print(f"{family} bf16 rel err vs bf16 ref {err:.2e}, vs fp32 ref {err32:.2e} "
          f"(transformers bf16 vs fp32: {ref_err32:.2e})")
    assert err < BF16_TOL
    assert err32 < 2 * ref_err32 + 1e-2
