"""Triton gated delta rule (recurrent decode step, chunked varlen prefill) against the twins.

State pools carry non-zero initial states at shuffled slots; unused slots are
NaN and must stay bitwise untouched. q, k, v are non-contiguous views (as the
model's split of the conv output is). Tolerances (relative RMS): fp32 1e-5
(measured ~2e-7 recurrent; chunked ~5e-7 outputs, up to ~2e-6 final states);
bf16 inputs 2e-2 (measured ~4e-3, mostly the bf16 rounding of the outputs;
on the GPU the kernels use tf32 dots for bf16 inputs).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ignis.kernels.gated_delta_rule import reference as ref
from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent
from tests.kernels.conftest import assert_close, assert_untouched, cu_seqlens, strided

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_inputs(total, hk, hv, dk, dv, dtype, device, gen):
    q = strided((total, hk, dk), dtype, device, gen)
    k = strided((total, hk, dk), dtype, device, gen)
    v = strided((total, hv, dv), dtype, device, gen)
    # decays as the model makes them: -exp(A_log) * softplus(a + dt_bias)
    g = (-F.softplus(torch.randn((total, hv), generator=gen)) * 0.5).to(device)
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
]


@pytest.mark.parametrize("hk,hv,dk,dv,dtype,lengths", CHUNK_CASES)
def test_chunk_matches_twin(device, gen, hk, hv, dk, dv, dtype, lengths):
    num_slots = len(lengths) + 3
    slots = torch.randperm(num_slots, generator=gen)[:len(lengths)].tolist()
    q, k, v, g, beta = make_inputs(sum(lengths), hk, hv, dk, dv, dtype, device, gen)
    pool = make_pool(num_slots, slots, hv, dk, dv, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    cu = cu_seqlens(lengths, device)
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, want_pool, idx, cu)
    got = triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, got_pool, idx, cu)
    what = f"chunk Hk={hk} Hv={hv} Dk={dk} Dv={dv} {dtype} lengths={lengths}"
    assert_close(got, want, TOL[dtype], what + " output")
    assert_close(got_pool[slots], want_pool[slots], TOL[dtype], what + " state")
    assert_untouched(got_pool, pool, unused(num_slots, slots), what)


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
