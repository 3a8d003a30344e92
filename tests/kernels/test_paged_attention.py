"""Triton paged attention (KV write, prefill, split-K decode) against the torch twins.

Pools are NaN-filled, with each sequence's pages drawn shuffled from a pool
that keeps free pages; page-table entries past a context point at a free
(NaN) page, so reading outside a context poisons the result. Queries are
non-contiguous views. Tolerances (relative RMS): fp32 1e-5 (measured
~2e-7); bf16 2e-2 (measured ~4e-3; the twin rounds scores and
probabilities to bf16, the kernels keep them in fp32).
"""

from __future__ import annotations

import pytest
import torch

from ignis.kernels.paged_attention import reference as ref
from ignis.kernels.paged_attention import triton_decode, triton_prefill, triton_write
from tests.kernels.conftest import PAGE, assert_close, cu_seqlens, rel_rms, strided

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def build_pool(contexts: list[int], hkv: int, d: int, dtype, device, gen, free_pages: int = 3):
    """NaN pool holding each context at shuffled pages -> (k_cache, v_cache, page_table)."""
    need = [(n + PAGE - 1) // PAGE for n in contexts]
    num_pages = sum(need) + free_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    free = perm[-1]
    k_cache = torch.full((num_pages, PAGE, hkv, d), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.full((len(contexts), max(need) + 1), free, dtype=torch.int32)
    used = 0
    for b, n in enumerate(contexts):
        pages = perm[used:used + need[b]]
        used += need[b]
        table[b, :need[b]] = torch.tensor(pages, dtype=torch.int32)
        slots = torch.tensor([pages[p // PAGE] * PAGE + p % PAGE for p in range(n)], device=device)
        key = torch.randn((n, hkv, d), generator=gen).to(device=device, dtype=dtype)
        value = torch.randn((n, hkv, d), generator=gen).to(device=device, dtype=dtype)
        ref.write_kv(k_cache, v_cache, key, value, slots)
    return k_cache, v_cache, table.to(device)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                     (torch.float32, torch.bfloat16)])
def test_write_kv_matches_and_touches_only_its_slots(device, gen, src, dst):
    """Same dtype: bitwise. fp32 -> bf16: within one bf16 ulp (the interpreter truncates)."""
    hkv, d, num_pages, total = 3, 24, 5, 77
    slots = torch.randperm(num_pages * PAGE, generator=gen)[:total].to(device)
    key = strided((total, hkv, d), src, device, gen)
    value = strided((total, hkv, d), src, device, gen)
    want_k = torch.full((num_pages, PAGE, hkv, d), float("nan"), dtype=dst, device=device)
    want_v = torch.full_like(want_k, float("nan"))
    got_k, got_v = want_k.clone(), want_v.clone()
    ref.write_kv(want_k, want_v, key, value, slots)
    triton_write.write_kv(got_k, got_v, key, value, slots)
    ulp = 0.0 if src == dst else 2.0 ** -7
    for got, want, name in ((got_k, want_k, "k"), (got_v, want_v, "v")):
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: written slots differ from the twin's"
        written = ~want.isnan()
        diff = (got[written].float() - want[written].float()).abs()
        assert bool((diff <= ulp * want[written].float().abs()).all()), f"{name}: values differ"


def test_write_kv_skips_negative_slots(device, gen):
    k_cache = torch.full((2, PAGE, 1, 16), float("nan"), device=device)
    v_cache = k_cache.clone()
    key = torch.randn((2, 1, 16), generator=gen).to(device)
    triton_write.write_kv(k_cache, v_cache, key, key, torch.tensor([-1, 70], device=device))
    assert int((~k_cache.isnan()).sum()) == 16
    assert torch.equal(k_cache.view(-1, 1, 16)[70], key[1])


# (Hq, Hkv, D, dtype): GQA ratios 1, 4 and 6; tiny and real head dims
PREFILL_CASES = [
    (2, 2, 16, torch.float32),
    (8, 2, 64, torch.float32),
    (6, 1, 128, torch.float32),
    (12, 2, 64, torch.bfloat16),
]
# (context after the step, new tokens): 1-token chunks, page-boundary and multi-page chunks,
# chunks continuing earlier context, lengths that are not multiples of 64
PREFILL_SEQS = [(1, 1), (70, 5), (130, 130), (200, 1), (128, 64), (67, 3)]


def _prefill_case(hq, hkv, d, dtype, seqs, device, gen):
    contexts = [c for c, _ in seqs]
    news = [n for _, n in seqs]
    k_cache, v_cache, table = build_pool(contexts, hkv, d, dtype, device, gen)
    query = strided((sum(news), hq, d), dtype, device, gen)
    cu = cu_seqlens(news, device)
    lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    scale = d ** -0.5
    want = ref.prefill_attention(query, k_cache, v_cache, table, cu, lens, scale)
    got = triton_prefill.prefill_attention(query, k_cache, v_cache, table, cu, lens, scale)
    return assert_close(got, want, TOL[dtype], f"prefill Hq={hq} Hkv={hkv} D={d} {dtype}")


@pytest.mark.parametrize("hq,hkv,d,dtype", PREFILL_CASES)
def test_prefill_matches_twin(device, gen, hq, hkv, d, dtype):
    _prefill_case(hq, hkv, d, dtype, PREFILL_SEQS, device, gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_gated_matches_twin(device, gen, dtype):
    """The output gate in the kernel's epilogue (a strided view, as q_proj's split makes it) against
    the twin's attention times sigmoid(gate); the ungated result differs from it."""
    seqs = [(70, 5), (130, 130), (1, 1)]
    k_cache, v_cache, table = build_pool([c for c, _ in seqs], 2, 64, dtype, device, gen)
    query = strided((136, 4, 64), dtype, device, gen)
    gate = strided((136, 4, 64), dtype, device, gen, scale=2.0)
    cu = cu_seqlens([n for _, n in seqs], device)
    lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32, device=device)
    want = ref.prefill_attention(query, k_cache, v_cache, table, cu, lens, 0.125, gate=gate)
    got = triton_prefill.prefill_attention(query, k_cache, v_cache, table, cu, lens, 0.125, gate=gate)
    assert_close(got, want, TOL[dtype], f"gated prefill {dtype}")
    ungated = ref.prefill_attention(query, k_cache, v_cache, table, cu, lens, 0.125)
    assert rel_rms(ungated, want) > 0.1, "the gate changed nothing: the case cannot tell gated from not"
    with pytest.raises(ValueError, match="gate"):
        triton_prefill.prefill_attention(query, k_cache, v_cache, table, cu, lens, 0.125, gate=gate[:, :2])


def _decode_case(hq, hkv, d, dtype, contexts, device, gen, split_tokens=None):
    k_cache, v_cache, table = build_pool(contexts, hkv, d, dtype, device, gen)
    query = strided((len(contexts), hq, d), dtype, device, gen)
    lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    scale = d ** -0.5
    want = ref.decode_attention(query, k_cache, v_cache, table, lens, scale)
    got = triton_decode.decode_attention(query, k_cache, v_cache, table, lens, scale, split_tokens=split_tokens)
    return assert_close(got, want, TOL[dtype], f"decode Hq={hq} Hkv={hkv} D={d} {dtype} split={split_tokens}")


DECODE_CONTEXTS = [1, 64, 65, 200, 130, 7]


@pytest.mark.parametrize("hq,hkv,d,dtype", PREFILL_CASES)
def test_decode_matches_twin(device, gen, hq, hkv, d, dtype):
    _decode_case(hq, hkv, d, dtype, DECODE_CONTEXTS, device, gen)


def test_decode_many_small_splits(device, gen):
    """One key tile per split: the reduce kernel combines up to 13 partials."""
    block = triton_decode._blocks(32, torch.float32, device.type == "cpu")[0]
    _decode_case(4, 1, 32, torch.float32, [3, 13 * block - 5, 2 * block], device, gen, split_tokens=block)


def test_decode_in_a_table_far_wider_than_its_contexts(device, gen):
    """A captured decode graph's table spans the longest admitted sequence: each sequence divides its own
    context over the splits, the columns past it (pointing at a NaN page) are never read."""
    contexts = [1, 200, 130, 7, 64]
    k_cache, v_cache, table = build_pool(contexts, 1, 32, torch.float32, device, gen)
    wide = torch.cat([table, table[:, -1:].expand(-1, 60)], dim=1)  # 64 columns: a 4K-token capacity
    query = strided((len(contexts), 4, 32), torch.float32, device, gen)
    lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    want = ref.decode_attention(query, k_cache, v_cache, table, lens, 32 ** -0.5)
    got = triton_decode.decode_attention(query, k_cache, v_cache, wide, lens, 32 ** -0.5)
    assert_close(got, want, TOL[torch.float32], "decode in a wide table")


def test_decode_empty_sequences_give_zeros(device, gen):
    """Rows of length 0 among normal rows: no split is written for them (the partials stay NaN) and
    none is read; they come out zero from kernel and twin, the others match the twin."""
    contexts = [0, 70, 0, 5, 130]
    k_cache, v_cache, table = build_pool([max(n, 1) for n in contexts], 2, 32, torch.float32, device, gen)
    query = strided((len(contexts), 4, 32), torch.float32, device, gen)
    lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    want = ref.decode_attention(query, k_cache, v_cache, table, lens, 32 ** -0.5)
    empty, full = [0, 2], [1, 3, 4]
    assert bool((want[empty] == 0).all()), "twin: empty rows are not zero"
    block = triton_decode._blocks(32, torch.float32, device.type == "cpu")[0]
    for split in (None, block):
        got = triton_decode.decode_attention(query, k_cache, v_cache, table, lens, 32 ** -0.5, split_tokens=split)
        assert bool((got[empty] == 0).all()), f"kernel (split={split}): empty rows are not zero"
        assert_close(got[full], want[full], TOL[torch.float32], f"decode beside empty rows, split={split}")
    only_empty = torch.zeros(2, dtype=torch.int32, device=device)
    got = triton_decode.decode_attention(query[:2], k_cache, v_cache, table[:2], only_empty, 32 ** -0.5)
    assert bool((got == 0).all()) and bool((ref.decode_attention(
        query[:2], k_cache, v_cache, table[:2], only_empty, 32 ** -0.5) == 0).all())


def test_decode_rejects_bad_split(device, gen):
    with pytest.raises(ValueError, match="split_tokens"):
        _decode_case(2, 1, 16, torch.float32, [5], device, gen, split_tokens=3)


def test_split_plan_fills_the_gpu_for_one_long_sequence():
    sms = 132  # H200
    splits, tokens = triton_decode.split_plan(1, 4, 65536, 64, sms)
    assert splits * 4 >= 2 * sms and splits * tokens >= 65536 and tokens % 64 == 0
    splits, tokens = triton_decode.split_plan(64, 4, 65536, 64, sms)
    assert splits * 64 * 4 >= sms and splits * tokens >= 65536
    assert triton_decode.split_plan(8, 4, 64, 64, sms) == (1, 64)


def test_head_dim_256_prefill_and_decode(device, gen):
    """The 27B head dim, on a small batch (the interpreter is slow at D=256)."""
    _prefill_case(4, 1, 256, torch.float32, [(70, 6), (1, 1)], device, gen)
    _decode_case(4, 1, 256, torch.float32, [70, 1], device, gen)


@pytest.mark.parametrize("n", [1, 5, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twin_tail_over_page_runs_matches_the_gathered_form(gen, n, dtype):
    """The twin's short-tail path reads the pool in place, run by run: the same result as gathering the
    context and running the masked softmax, across runs of consecutive and scattered pages (NaN pool)."""
    import torch.nn.functional as F

    length = 300 + n
    k_cache, v_cache, table = build_pool([length], 2, 32, dtype, "cpu", gen)
    query = torch.randn((n, 6, 32), generator=gen).to(dtype)
    k = ref.gather_context(k_cache, table[0], length)
    v = ref.gather_context(v_cache, table[0], length)
    qpos = torch.arange(length - n, length).view(n, 1)
    want = F.scaled_dot_product_attention(
        query.float().transpose(0, 1).unsqueeze(0), k.float().transpose(0, 1).unsqueeze(0),
        v.float().transpose(0, 1).unsqueeze(0), attn_mask=torch.arange(length).view(1, length) <= qpos,
        scale=32 ** -0.5, enable_gqa=True)[0].transpose(0, 1)
    got = ref.tail_attention(query, k_cache, v_cache, table[0].tolist(), length, 32 ** -0.5)
    assert not got.isnan().any()
    assert_close(got.float(), want, TOL[dtype], f"twin tail n={n} {dtype}")
    runs = ref.page_runs([4, 5, 6, 9, 2, 3], 6 * 64 - 10, 64)
    assert runs == [(4, 3, 192), (9, 1, 64), (2, 2, 118)]


def test_decode_twin_equals_attention_over_each_context_alone(gen):
    """The twin against a plain softmax over each sequence's own positions: what the pool holds past a
    length (NaN keys, infinite values) and in the pages a table names past it is never read."""
    contexts, hq, hkv, d = [0, 70, 5, 130, 64], 4, 2, 32
    k_cache, v_cache, table = build_pool([max(n, 1) for n in contexts], hkv, d, torch.float32, "cpu", gen)
    for b, n in enumerate(contexts):  # poison the rest of each context's last page
        for pos in range(n, (max(n, 1) + PAGE - 1) // PAGE * PAGE):
            page = int(table[b, pos // PAGE])
            k_cache[page, pos % PAGE] = float("nan")
            v_cache[page, pos % PAGE] = float("inf")
    query = torch.randn((len(contexts), hq, d), generator=gen)
    lens = torch.tensor(contexts, dtype=torch.int32)
    got = ref.decode_attention(query, k_cache, v_cache, table, lens, d ** -0.5)
    for b, n in enumerate(contexts):
        if n == 0:
            assert bool((got[b] == 0).all())
            continue
        rows = [int(table[b, p // PAGE]) for p in range(n)]
        k = torch.stack([k_cache[r, p % PAGE] for p, r in enumerate(rows)]).repeat_interleave(hq // hkv, 1)
        v = torch.stack([v_cache[r, p % PAGE] for p, r in enumerate(rows)]).repeat_interleave(hq // hkv, 1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", query[b], k) * d ** -0.5, dim=-1)
        assert_close(got[b], torch.einsum("hn,nhd->hd", probs, v), 1e-5, f"sequence {b}")
