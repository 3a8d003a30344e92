"""Triton causal conv1d + SiLU (varlen prefill, one-step update) against the twins.

Histories sit at shuffled slots of a NaN-poisoned pool (unused slots must
stay bitwise untouched); sequences shorter than the K - 1 history columns
exercise the old-history path of the new state. x is a non-contiguous view.
Tolerances (relative RMS): fp32 1e-5 (measured ~6e-8); bf16 2e-2 (measured
~4e-3: the twin convolves in bf16, the kernels accumulate in fp32).
"""

from __future__ import annotations

import pytest
import torch

from ignis.kernels.causal_conv import reference as ref
from ignis.kernels.causal_conv import triton_conv
from tests.kernels.conftest import assert_close, assert_untouched, cu_seqlens, strided

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_pool(num_slots, used, channels, taps, dtype, device, gen):
    pool = torch.full((num_slots, channels, taps - 1), float("nan"), dtype=dtype, device=device)
    pool[used] = torch.randn((len(used), channels, taps - 1), generator=gen).to(device=device, dtype=dtype)
    return pool


@pytest.mark.parametrize("channels,taps,dtype,lengths", [
    (40, 4, torch.float32, [1, 2, 5, 70, 130]),
    (96, 3, torch.float32, [64, 1]),
    (40, 4, torch.bfloat16, [3, 33]),
])
def test_varlen_matches_twin(device, gen, channels, taps, dtype, lengths):
    num_slots = len(lengths) + 2
    slots = torch.randperm(num_slots, generator=gen)[:len(lengths)].tolist()
    x = strided((sum(lengths), channels), dtype, device, gen)
    weight = (torch.randn((channels, taps), generator=gen) * 0.5).to(device=device, dtype=dtype)
    pool = make_pool(num_slots, slots, channels, taps, dtype, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    cu = cu_seqlens(lengths, device)
    want = ref.causal_conv1d_varlen(x, weight, want_pool, idx, cu)
    got = triton_conv.causal_conv1d_varlen(x, weight, got_pool, idx, cu)
    what = f"conv varlen C={channels} K={taps} {dtype} lengths={lengths}"
    assert_close(got, want, TOL[dtype], what + " output")
    assert torch.equal(got_pool[slots], want_pool[slots]), what + ": new histories differ"
    assert_untouched(got_pool, pool, [s for s in range(num_slots) if s not in slots], what)


@pytest.mark.parametrize("channels,taps,dtype", [(40, 4, torch.float32), (300, 2, torch.float32),
                                                 (72, 4, torch.bfloat16)])
def test_update_matches_twin(device, gen, channels, taps, dtype):
    slots = [4, 1, 2]
    x = strided((len(slots), channels), dtype, device, gen)
    weight = (torch.randn((channels, taps), generator=gen) * 0.5).to(device=device, dtype=dtype)
    pool = make_pool(6, slots, channels, taps, dtype, device, gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device=device)
    want = ref.causal_conv1d_update(x, weight, want_pool, idx)
    got = triton_conv.causal_conv1d_update(x, weight, got_pool, idx)
    what = f"conv update C={channels} K={taps} {dtype}"
    assert_close(got, want, TOL[dtype], what + " output")
    assert torch.equal(got_pool[slots], want_pool[slots]), what + ": shifted histories differ"
    assert_untouched(got_pool, pool, [0, 3, 5], what)


def test_rejects_mismatched_history(device):
    with pytest.raises(ValueError, match="conv_state"):
        triton_conv.causal_conv1d_update(torch.zeros((1, 8), device=device), torch.zeros((8, 4), device=device),
                                         torch.zeros((1, 8, 2), device=device), torch.zeros(1, dtype=torch.long,
                                                                                         device=device))


@pytest.mark.parametrize("lengths", [[3, 3, 3], [1, 4, 2, 70, 3, 1]])
def test_twin_varlen_equals_one_step_per_token(gen, lengths):
    """The twin runs sequences of one length as one batched conv: equal to an update step per token."""
    channels, taps = 24, 4
    slots = [5, 0, 3, 1, 6, 2][: len(lengths)]
    x = strided((sum(lengths), channels), torch.float32, "cpu", gen)
    weight = torch.randn((channels, taps), generator=gen) * 0.5
    pool = make_pool(8, slots, channels, taps, torch.float32, "cpu", gen)
    want_pool, got_pool = pool.clone(), pool.clone()
    got = ref.causal_conv1d_varlen(x, weight, got_pool, torch.tensor(slots), cu_seqlens(lengths, "cpu"))
    want, at = [], 0
    for n, slot in zip(lengths, slots):
        want += [ref.causal_conv1d_update(x[t:t + 1], weight, want_pool, torch.tensor([slot]))
                 for t in range(at, at + n)]
        at += n
    assert_close(got, torch.cat(want), 1e-5, f"twin varlen {lengths}")
    assert torch.equal(got_pool[slots], want_pool[slots]), "histories differ"
    assert_untouched(got_pool, pool, [4, 7], "twin varlen")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_twin_one_step_rounds_exactly_as_its_prefill_does(gen, dtype):
    """A token computed as a one-token step (a resumed prompt's last piece, a decode) must come out bit for
    bit as the same token in a prefill: in bf16 a product-then-sum step rounded each product first, and a
    resumed request answered unlike its cold run."""
    channels, taps, n = 768, 4, 9
    x = (torch.randn((n, channels), generator=gen) * 2).to(dtype)
    weight = (torch.randn((channels, taps), generator=gen) * 0.5).to(dtype)
    pool = torch.zeros((2, channels, taps - 1), dtype=dtype)
    steps_pool = pool.clone()
    whole = ref.causal_conv1d_varlen(x, weight, pool, torch.tensor([0]), cu_seqlens([n], "cpu"))
    head = ref.causal_conv1d_varlen(x[:n - 1], weight, steps_pool, torch.tensor([0]), cu_seqlens([n - 1], "cpu"))
    last = ref.causal_conv1d_update(x[n - 1:], weight, steps_pool, torch.tensor([0]))
    assert torch.equal(torch.cat([head, last]), whole)
    assert torch.equal(steps_pool, pool)
