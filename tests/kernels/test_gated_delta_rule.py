"""Triton gated delta rule (recurrent decode step, chunked varlen prefill) against the twins.

State pools carry non-zero initial states at shuffled slots; unused slots are
NaN and must stay bitwise untouched. q, k, v are non-contiguous views (as the
model's split of the conv output is). Tolerances (relative RMS): fp32 1e-5
(measured ~2e-7 recurrent; chunked ~5e-7 outputs, up to ~5e-6 final states);
bf16 inputs 2e-2 (measured ~4e-3, mostly the bf16 rounding of the outputs;
on the GPU the kernels use tf32 dots for bf16 inputs). The model's decays
fade a chunk's early tokens from its late rows; a slow-decay case keeps every
block of the chunk's (I + A)^-1 in play, and the blocked inverse is also
checked on its own against an fp64 triangular solve (measured ~1e-7).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ignis.engine.memory_plan import gdn_scratch_bytes
from ignis.engine.models.config import config_from_dict
from ignis.kernels.gated_delta_rule import reference as ref
from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent, triton_wy
from tests.kernels.conftest import assert_close, assert_untouched, cu_seqlens, strided

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
BT, BC = triton_chunk.BT, triton_wy.BC


def make_inputs(total, hk, hv, dk, dv, dtype, device, gen, g_scale=0.5):
    q = strided((total, hk, dk), dtype, device, gen)
    k = strided((total, hk, dk), dtype, device, gen)
    v = strided((total, hv, dv), dtype, device, gen)
    # decays as the model makes them: -exp(A_log) * softplus(a + dt_bias)
    g = (-F.softplus(torch.randn((total, hv), generator=gen)) * g_scale).to(device)
    beta = torch.rand((total, hv), generator=gen).to(device=device, dtype=dtype)
    return q, k, v, g, beta


def make_pool(num_slots, used, hv, dk, dv, device, gen):
    """fp32 pool: random states (scaled like a run's) at ``used``, NaN elsewhere."""
    pool = torch.full((num_slots, hv, dk, dv), float("nan"), device=device)
    pool[used] = (torch.randn((len(used), hv, dk, dv), generator=gen) * 0.3).to(device)
    return pool


def unused(num_slots: int, used: list[int]) -> list[int]:
    return [s for s in range(num_slots) if s not in used]


# (Hk, Hv, Dk, Dv, dtype)
RECURRENT_CASES = [
    (2, 2, 16, 16, torch.float32),
    (1, 3, 64, 32, torch.float32),
    (2, 4, 128, 128, torch.float32),
    (2, 4, 64, 64, torch.bfloat16),
]


@pytest.mark.parametrize("hk,hv,dk,dv,dtype", RECURRENT_CASES)
def test_recurrent_matches_twin(device, gen, hk, hv, dk, dv, dtype):
    slots = [5, 0, 3, 6]
    q, k, v, g, beta = make_inputs(len(slots), hk, hv, dk, dv, dtype, device, gen)
    pool = make_pool(8, slots, hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    want = ref.recurrent_gated_delta_rule(q, k, v, g, beta, want_pool, idx)
    got = triton_recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, got_pool, idx)
    what = f"recurrent Hk={hk} Hv={hv} Dk={dk} Dv={dv} {dtype}"
    assert_close(got, want, TOL[dtype], what + " output")
    assert_close(got_pool[slots], want_pool[slots], TOL[torch.float32], what + " state")
    assert_untouched(got_pool, pool, unused(8, slots), what)


# (Hk, Hv, Dk, Dv, dtype, lengths): lengths mix 1-token, exact-chunk and ragged sequences
CHUNK_CASES = [
    (2, 4, 16, 32, torch.float32, [1, 70, 130, 64]),
    (1, 2, 64, 64, torch.float32, [3, 65]),
    (2, 2, 32, 16, torch.bfloat16, [129, 1]),
    (1, 1, 128, 128, torch.float32, [1, 80]),
    # many chunks in one sequence: exactly 9 * 64 tokens, and a ragged 600
    (1, 2, 16, 16, torch.float32, [9 * BT]),
    (1, 2, 16, 32, torch.float32, [600]),
    # a varlen mix in bf16 (bf16 chunk-start states), and short sequences only
    (2, 4, 16, 16, torch.bfloat16, [BT, 1, 200, 2 * BT, 5, BT - 1]),
    (1, 2, 32, 16, torch.float32, [1, 2, 3, 7, 1]),
]


@pytest.mark.parametrize("hk,hv,dk,dv,dtype,lengths,g_scale",
                         [(*case, 0.5) for case in CHUNK_CASES]
                         # slow decay: every token of a chunk still weighs on its last rows
                         + [(1, 2, 16, 16, torch.float32, [64, 100], 0.01)]
                         # strong decay, as the models' exp(A_log) up to 16 gives: the carried state
                         # hangs on each chunk's last tokens (the 27B's 2:6 head ratio)
                         + [(2, 6, 32, 32, torch.float32, [64, 129], 8.0)])
def test_chunk_matches_twin(device, gen, hk, hv, dk, dv, dtype, lengths, g_scale):
    num_slots = len(lengths) + 3
    slots = torch.randperm(num_slots, generator=gen)[:len(lengths)].tolist()
    q, k, v, g, beta = make_inputs(sum(lengths), hk, hv, dk, dv, dtype, device, gen, g_scale)
    pool = make_pool(num_slots, slots, hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    cu = cu_seqlens(lengths, device)
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, want_pool, idx, cu)
    got = triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, got_pool, idx, cu)
    what = f"chunk Hk={hk} Hv={hv} Dk={dk} Dv={dv} {dtype} lengths={lengths} g_scale={g_scale}"
    assert_close(got, want, TOL[dtype], what + " output")
    assert_close(got_pool[slots], want_pool[slots], TOL[dtype], what + " state")
    assert_untouched(got_pool, pool, unused(num_slots, slots), what)


def wy_twin(k, v, g, beta, lengths):
    """u and w of every chunk by a dense (I + A)^-1 in fp64: the WY kernel's definition."""
    rep = v.shape[1] // k.shape[1]
    kn = ref.l2norm(k.double()).repeat_interleave(rep, dim=1).transpose(0, 1)  # [Hv, T, Dk]
    vb = (v.double() * beta.double()[..., None]).transpose(0, 1)
    g64, b64 = g.double().transpose(0, 1), beta.double().transpose(0, 1)
    u, w = torch.empty_like(vb), torch.empty_like(kn)
    start = 0
    for n in lengths:
        for c0 in range(start, start + n, BT):
            sl = slice(c0, min(c0 + BT, start + n))
            gc = g64[:, sl].cumsum(-1)
            kc = kn[:, sl]
            a = (b64[:, sl, None] * (kc @ kc.transpose(-1, -2)) * (gc[:, :, None] - gc[:, None, :]).exp()).tril(-1)
            inv = torch.linalg.inv(torch.eye(a.shape[-1], dtype=a.dtype) + a)
            u[:, sl] = inv @ vb[:, sl]
            w[:, sl] = inv @ (kc * (b64[:, sl] * gc.exp())[..., None])
        start += n
    return u.transpose(0, 1), w.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_wy_matches_dense_inverse(device, gen, dtype):
    """Kernel 1 alone (what bench/gpu_check times) against a dense fp64 inverse per chunk: a ragged
    and a one-token sequence, 3 value heads on a key head."""
    lengths = [100, 1]
    _, k, v, g, beta = make_inputs(sum(lengths), 1, 3, 32, 16, dtype, device, gen)
    u, w = triton_chunk.chunk_wy(k, v, g, beta, cu_seqlens(lengths, device))
    want_u, want_w = wy_twin(k.cpu(), v.cpu(), g.cpu(), beta.cpu(), lengths)
    tol = 1e-5 if dtype == torch.float32 else 2e-3  # bf16 inputs: tf32 dots on the GPU
    assert_close(u.cpu().double(), want_u, tol, f"chunk_wy u {dtype}")
    assert_close(w.cpu().double(), want_w, tol, f"chunk_wy w {dtype}")


# (state BV, warps, stages, output BV, warps[, WY warps, register cap]): several value blocks
# in either pass; the WY kernel at 8 warps under a register cap
BLOCK_CASES = [triton_chunk.ChunkBlocks(16, 4, 1, 64, 4), triton_chunk.ChunkBlocks(64, 4, 2, 16, 4, 8, 128)]


@pytest.mark.parametrize("blocks", BLOCK_CASES,
                         ids=lambda b: f"state{b.state_bv}-out{b.out_bv}-wy{b.wy_warps}.{b.wy_maxnreg}")
def test_chunk_tiles_override(device, gen, blocks):
    """``blocks=`` tiles split the value columns differently in the state and output passes;
    the result is the twin's either way."""
    hk, hv, dk, dv, lengths = 1, 2, 32, 64, [130, BT, 3]
    slots = [4, 0, 2]
    q, k, v, g, beta = make_inputs(sum(lengths), hk, hv, dk, dv, torch.float32, device, gen)
    pool = make_pool(5, slots, hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    cu = cu_seqlens(lengths, device)
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, want_pool, idx, cu)
    got = triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, got_pool, idx, cu, blocks=blocks)
    assert_close(got, want, 1e-5, f"chunk {blocks} output")
    assert_close(got_pool[slots], want_pool[slots], 1e-5, f"chunk {blocks} state")
    assert_untouched(got_pool, pool, unused(5, slots), f"chunk {blocks}")


@pytest.mark.parametrize("dtype,lengths", [(torch.float32, [130, 1]), (torch.bfloat16, [64, 0, 65])])
def test_chunk_scratch_is_what_a_call_allocates(device, gen, monkeypatch, dtype, lengths):
    """``chunk_scratch_bytes`` (which the memory plan mirrors) is every buffer a call makes
    besides its output: u, w and the chunk-start states, bf16 ones for bf16 inputs."""
    hk, hv, dk, dv = 1, 2, 16, 32
    q, k, v, g, beta = make_inputs(sum(lengths), hk, hv, dk, dv, dtype, device, gen)
    pool = make_pool(len(lengths), list(range(len(lengths))), hv, dk, dv, device, gen)
    made = []
    empty = torch.empty

    def recording_empty(*a, **kw):
        t = empty(*a, **kw)
        made.append(t)
        return t

    monkeypatch.setattr(torch, "empty", recording_empty)
    out = triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, pool, torch.arange(len(lengths), device=device),
                                              cu_seqlens(lengths, device))
    scratch = [t for t in made if t.data_ptr() != out.data_ptr()]
    got = sum(t.numel() * t.element_size() for t in scratch)
    want = triton_chunk.chunk_scratch_bytes(sum(lengths), len(lengths), hv, dk, dv, dtype != torch.float32)
    assert got == want, f"{[(tuple(t.shape), t.dtype) for t in scratch]}: {got} bytes, expected {want}"
    states = [t for t in scratch if t.dim() == 4]
    assert len(states) == 1 and states[0].dtype == (torch.float32 if dtype == torch.float32 else torch.bfloat16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_memory_plan_scratch_is_the_kernels(dtype):
    """The engine's memory plan (pure Python) sets aside what the kernel allocates."""
    base = config_from_dict(dict(
        architectures=["Qwen3_5ForCausalLM"], num_hidden_layers=4, full_attention_interval=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, hidden_size=64, intermediate_size=128, vocab_size=128, dtype=dtype))
    for hv, dk, dv in ((48, 128, 128), (32, 128, 128), (4, 16, 32)):
        cfg = dataclasses.replace(base, linear_num_key_heads=1, linear_num_value_heads=hv, linear_key_head_dim=dk,
                                  linear_value_head_dim=dv)
        for tokens, seqs in ((8192, 1), (2048, 32), (100, 3), (64, 1)):
            assert gdn_scratch_bytes(cfg, dtype, tokens, seqs) == triton_chunk.chunk_scratch_bytes(
                tokens, seqs, hv, dk, dv, half_states=dtype != "float32"), (tokens, seqs, hv, dk, dv)


def test_chunk_with_empty_sequences_over_several_lookup_blocks(device, gen, monkeypatch):
    """Kernel 1 finds each chunk's sequence on the device, reading chunk counts SEQ_BLOCK
    sequences at a time: empty sequences own no chunk and keep their state, and the grid's
    spare programs past the last chunk write nothing."""
    monkeypatch.setattr(triton_chunk, "SEQ_BLOCK", 4)
    lengths = [0, 65, 0, 0, 3, 1, 0, 130, 0, 2]
    hk, hv, dk, dv = 1, 2, 16, 16
    slots = torch.randperm(len(lengths) + 2, generator=gen)[:len(lengths)].tolist()
    q, k, v, g, beta = make_inputs(sum(lengths), hk, hv, dk, dv, torch.float32, device, gen)
    pool = make_pool(len(lengths) + 2, slots, hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    cu = cu_seqlens(lengths, device)
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, want_pool, idx, cu)
    got = triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, got_pool, idx, cu)
    assert_close(got, want, 1e-5, f"chunk lengths={lengths} output")
    assert_close(got_pool[slots], want_pool[slots], 1e-5, f"chunk lengths={lengths} state")
    empty = [s for s, n in zip(slots, lengths) if n == 0]
    assert bool((got_pool[empty] == pool[empty]).all()), "an empty sequence's state changed"
    assert_untouched(got_pool, pool, unused(len(lengths) + 2, slots), "chunk with empty sequences")


def test_chunk_then_recurrent_continues_the_state(device, gen):
    """A prefill then two decode steps equal one recurrent pass over all tokens."""
    hk, hv, dk, dv, n = 1, 2, 16, 16, 67
    q, k, v, g, beta = make_inputs(n + 2, hk, hv, dk, dv, torch.float32, device, gen)
    pool = make_pool(2, [1], hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    slot = torch.tensor([1], device=device)
    want = [ref.recurrent_gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1],
                                           want_pool, slot) for t in range(n + 2)]
    got = [triton_chunk.chunk_gated_delta_rule(q[:n], k[:n], v[:n], g[:n], beta[:n], got_pool, slot,
                                               cu_seqlens([n], device))]
    got += [triton_recurrent.recurrent_gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                                        beta[t:t + 1], got_pool, slot) for t in (n, n + 1)]
    assert_close(torch.cat(got), torch.cat(want), 1e-5, "chunk + recurrent vs recurrent")
    assert_close(got_pool[1], want_pool[1], 1e-5, "final state")
    assert_untouched(got_pool, pool, [0], "chunk + recurrent")


_unit_lower_inverse = triton_wy._unit_lower_inverse


@triton.jit
def _block_ptrs(base, rb, cb, N: tl.constexpr, BC: tl.constexpr):
    offs = tl.arange(0, BC)
    return base + (rb * BC + offs)[:, None] * N + (cb * BC + offs)[None, :]


@triton.jit
def _inverse_kernel(a, out, N: tl.constexpr, BC: tl.constexpr):
    """out[m] = (I + a[m])^-1 for strictly lower [N, N] a[m], through the chunk kernel's blocked inverse."""
    src = a + tl.program_id(0) * N * N
    dst = out + tl.program_id(0) * N * N
    i00, i10, i11, i20, i21, i22, i30, i31, i32, i33 = _unit_lower_inverse(
        tl.load(_block_ptrs(src, 0, 0, N, BC)),
        tl.load(_block_ptrs(src, 1, 0, N, BC)), tl.load(_block_ptrs(src, 1, 1, N, BC)),
        tl.load(_block_ptrs(src, 2, 0, N, BC)), tl.load(_block_ptrs(src, 2, 1, N, BC)),
        tl.load(_block_ptrs(src, 2, 2, N, BC)),
        tl.load(_block_ptrs(src, 3, 0, N, BC)), tl.load(_block_ptrs(src, 3, 1, N, BC)),
        tl.load(_block_ptrs(src, 3, 2, N, BC)), tl.load(_block_ptrs(src, 3, 3, N, BC)),
        BC)
    tl.store(_block_ptrs(dst, 0, 0, N, BC), i00)
    tl.store(_block_ptrs(dst, 1, 0, N, BC), i10)
    tl.store(_block_ptrs(dst, 1, 1, N, BC), i11)
    tl.store(_block_ptrs(dst, 2, 0, N, BC), i20)
    tl.store(_block_ptrs(dst, 2, 1, N, BC), i21)
    tl.store(_block_ptrs(dst, 2, 2, N, BC), i22)
    tl.store(_block_ptrs(dst, 3, 0, N, BC), i30)
    tl.store(_block_ptrs(dst, 3, 1, N, BC), i31)
    tl.store(_block_ptrs(dst, 3, 2, N, BC), i32)
    tl.store(_block_ptrs(dst, 3, 3, N, BC), i33)


def chunk_systems(m, dk, spread, g_scale, gen, valid=BT):
    """m strictly lower [BT, BT] matrices as the chunk kernel builds them:
    A[i, j] = beta_i k_i.k_j exp(gc_i - gc_j) for j < i, unit-norm keys drawn around a
    common direction with the given spread (small spread: |k_i.k_j| near 1), rows past
    ``valid`` zero (a short last chunk)."""
    sign = torch.randint(0, 2, (m, BT, 1), generator=gen) * 2.0 - 1.0
    k = sign * torch.randn((m, 1, dk), generator=gen) + spread * torch.randn((m, BT, dk), generator=gen)
    k = F.normalize(k, dim=-1)
    beta = torch.rand((m, BT, 1), generator=gen)
    gc = (-F.softplus(torch.randn((m, BT), generator=gen)) * g_scale).cumsum(-1)
    a = (beta * (k @ k.transpose(-1, -2)) * (gc[:, :, None] - gc[:, None, :]).exp()).tril(-1)
    a[:, valid:] = 0
    return a


# (dk, key spread, decay scale, valid rows): independent keys with the model's decays; nearly
# parallel keys of either sign with little decay (entries of A and of the inverse up to ~1);
# the same in a short chunk
INVERSE_CASES = [(128, 1e3, 0.5, BT), (16, 0.2, 0.01, BT), (16, 0.2, 0.01, 37)]


@pytest.mark.parametrize("dk,spread,g_scale,valid", INVERSE_CASES)
def test_blocked_inverse_matches_triangular_solve(device, gen, dk, spread, g_scale, valid):
    m = 8
    a = chunk_systems(m, dk, spread, g_scale, gen, valid)
    eye = torch.eye(BT, dtype=torch.float64)
    want = torch.linalg.solve_triangular(eye + a.double(), eye.expand(m, BT, BT), upper=False)
    a_dev = a.to(device)
    got = torch.zeros_like(a_dev)
    _inverse_kernel[(m,)](a_dev, got, N=BT, BC=BC)
    got = got.cpu()
    print(f"max |A| {a.abs().max():.2f}, max off-diagonal |(I + A)^-1| {want.tril(-1).abs().max():.2f}")
    # the strictly lower part (the unit diagonal would dilute the relative error); the rest exactly
    assert_close(got.tril(-1), want.tril(-1), TOL[torch.float32],
                 f"blocked inverse dk={dk} spread={spread} valid={valid}")
    assert bool((got.triu(1) == 0).all()), "upper triangle of a diagonal block not exactly zero"
    assert bool((got.diagonal(dim1=-2, dim2=-1) == 1).all()), "diagonal not exactly one"
    assert bool((got[:, valid:] == eye[valid:].float()).all()), "padding rows not the identity's"


@pytest.mark.parametrize("lengths", [[3, 3, 3], [1, 4, 2, 70, 8, 9, 4]])
def test_twin_steps_short_sequences_as_token_by_token_decode(gen, lengths):
    """The twin's chunk op steps sequences of at most STEPPED_MAX tokens through the recurrence (verify
    chunks): short, long and mixed lengths equal a decode step per token, outputs and final states."""
    hk, hv, dk, dv = 2, 4, 16, 8
    total = sum(lengths)
    q, k, v, g, beta = make_inputs(total, hk, hv, dk, dv, torch.float32, "cpu", gen)
    slots = [5, 0, 3, 1, 6, 2, 4][: len(lengths)]
    pool = make_pool(8, slots, hv, dk, dv, "cpu", gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    got = ref.chunk_gated_delta_rule(q, k, v, g, beta, got_pool, torch.tensor(slots), cu_seqlens(lengths, "cpu"))
    want, at = [], 0
    for n, slot in zip(lengths, slots):
        for t in range(at, at + n):
            want.append(ref.recurrent_gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                                       beta[t:t + 1], want_pool, torch.tensor([slot])))
        at += n
    assert_close(got, torch.cat(want), 1e-5, f"stepped twin {lengths}")
    assert_close(got_pool[slots], want_pool[slots], 1e-5, "final states")
    assert_untouched(got_pool, pool, unused(8, slots), "stepped twin")
