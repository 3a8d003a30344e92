"""The sampler draws bit for bit what the plain reference draws, from its reused workspace, without writing its input."""

from __future__ import annotations

import math

import pytest
import torch

from ignis.engine.sampling import SamplerState, SamplerWorkspace, sample_batch
from ignis.engine.sampling_steps import draw, race_uniforms
from ignis.shared.sampling import SamplingParams
from tests.engine.sampling_reference import reference_batch

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5),
    dict(),
    dict(temperature=0.7),
    dict(temperature=0.7, top_k=20),
    dict(temperature=0.7, top_k=20, top_p=0.8),
    dict(top_p=0.95),
    dict(temperature=1.3, top_p=0.5),
    dict(min_p=0.05),
    dict(min_p=0.02, top_p=0.9),
    dict(temperature=0.8, top_k=50, min_p=0.1, top_p=0.7),
    dict(temperature=0.9, top_p=0.9, presence_penalty=1.0, repetition_penalty=1.2),
]
PROMPT = list(range(0, 600, 7))
PADDING = 7  # ids past the tokenizer, masked to -inf as the runner does


def states(settings: list[dict]) -> list[SamplerState]:
    return [SamplerState.from_params(SamplingParams(seed=100 + i, logprobs=True, **s), PROMPT)
            for i, s in enumerate(settings)]


def logits_for(kind: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    if kind == "bf16":
        x = x.to(torch.bfloat16).float()  # runs of equal logits, as a bf16 model gives
    x[:, vocab - PADDING:] = float("-inf")
    return x


@pytest.mark.parametrize("kind,vocab,rounds", [("fp32", 4096, 8), ("bf16", 4096, 8), ("bf16", 248_320, 1)])
def test_draws_tokens_logprobs_and_generator_states_of_the_reference(kind, vocab, rounds):
    ours, ref = states(SETTINGS), states(SETTINGS)
    want = [None if i % 3 else 3 for i in range(len(SETTINGS))]
    ws = SamplerWorkspace(vocab)
    for r in range(rounds):
        logits = logits_for(kind, len(SETTINGS), vocab, r)
        given = logits.clone()
        got_tokens, got_lps = sample_batch(logits, ours, want, ws)
        ref_tokens, ref_lps = reference_batch(logits, ref, want)
        assert got_tokens == ref_tokens
        assert got_lps == ref_lps  # floats compared exactly
        assert torch.equal(logits, given), "the caller's logits are never written"
    for a, b in zip(ours, ref):
        assert torch.equal(a.generator.get_state(), b.generator.get_state())
        assert a.output_counts == b.output_counts


@pytest.mark.parametrize("allowed", [1, 12, 400])
def test_rows_a_grammar_masked_draw_what_the_reference_draws(allowed):
    vocab = 4096
    ours, ref = states(SETTINGS), states(SETTINGS)
    want = [3] * len(SETTINGS)
    ws = SamplerWorkspace(vocab)
    gen = torch.Generator().manual_seed(allowed)
    for r in range(4):
        logits = logits_for("bf16", len(SETTINGS), vocab, r)
        for row in logits:  # fewer finite entries than top-k's k (or than top_logprobs) where allowed is small
            keep = torch.randperm(vocab - PADDING, generator=gen)[:allowed]
            row[~torch.isin(torch.arange(vocab), keep)] = float("-inf")
        got_tokens, got_lps = sample_batch(logits, ours, want, ws)
        ref_tokens, ref_lps = reference_batch(logits, ref, want)
        assert got_tokens == ref_tokens and got_lps == ref_lps
        assert all(torch.isfinite(logits[i, t]) for i, t in enumerate(got_tokens))
        assert all(len(lp.top) == min(3, allowed) for lp in got_lps)
    for a, b in zip(ours, ref):
        assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_ties_at_the_nucleus_boundary_keep_the_lower_token_ids():
    vocab, top, top_p = 4096, 5.0, 0.5
    logits = torch.zeros(1, vocab)
    logits[0, 0] = top  # one favourite, then vocab - 1 equal logits
    total = math.exp(top) + vocab - 1
    # a tie of rank j (1-based) stays while the mass before it, (e^top + j - 1) / total, is under top_p
    last_kept = math.floor(top_p * total - math.exp(top)) + 1
    drawn = set()
    for seed in range(300):
        st = SamplerState.from_params(SamplingParams(top_p=top_p, seed=seed), [])
        drawn.add(sample_batch(logits, [st], [None])[0][0])
    assert max(drawn) <= last_kept + 1
    assert max(drawn) > last_kept // 2  # it does draw across the kept ties


def test_one_workspace_serves_every_round_and_mixed_batches():
    vocab = 1024
    ws = SamplerWorkspace(vocab)
    buffers = [t.data_ptr() for t in (ws.row, ws.probs, ws.sorted, ws.cum, ws.order, ws.mask, ws.dist, ws.ids,
                                      ws.bits, ws.shifted)]
    settings = [dict(temperature=0.0), dict(top_p=0.9), dict(temperature=0.5, top_k=3, top_p=0.9)]
    for r in range(3):
        tokens, _ = sample_batch(logits_for("fp32", 3, vocab, r), states(settings), [None] * 3, ws)
        assert all(0 <= t < vocab - PADDING for t in tokens)
    assert buffers == [t.data_ptr() for t in (ws.row, ws.probs, ws.sorted, ws.cum, ws.order, ws.mask, ws.dist,
                                              ws.ids, ws.bits, ws.shifted)]
    assert ws.nbytes == vocab * (4 * 4 + 8 + 1 + 8 + 3 * 8)


@pytest.mark.parametrize("top_k", [0, 4])  # the whole row sorted, or only what top-k left
def test_an_entry_whose_mass_before_reaches_top_p_is_dropped(top_k):
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, -30.0, -30.0, -30.0, -30.0]])
    # ranks 0..3 carry 1/4 each (up to e^-30); before rank 2 lies exactly 1/2 when top-k has cut the tail
    drawn = {sample_batch(logits, [SamplerState.from_params(SamplingParams(top_p=0.5, top_k=top_k, seed=s), [])],
                          [None])[0][0] for s in range(200)}
    assert drawn == {0, 1}


def test_top_k_keeps_every_entry_tied_with_the_k_th():
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0, -1.0]])
    drawn = {sample_batch(logits, [SamplerState.from_params(SamplingParams(top_k=2, seed=s), [])], [None])[0][0]
             for s in range(300)}
    assert drawn == {0, 1, 2, 3}


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
def test_both_whole_row_top_p_forms_keep_what_the_reference_keeps(kind):
    from ignis.engine.sampling_steps import _top_p_by_permutation, _top_p_by_value
    from tests.engine.sampling_reference import _filter

    vocab = 4096
    ws = SamplerWorkspace(vocab)
    for seed, top_p in enumerate((0.1, 0.5, 0.8, 0.95, 0.999, 0.99999994)):
        logits = logits_for(kind, 1, vocab, seed)[0]
        want = _filter(logits, SamplerState.from_params(SamplingParams(top_p=top_p), []))
        by_value, by_permutation = logits.clone(), logits.clone()
        assert _top_p_by_value(by_value, top_p, ws)
        _top_p_by_permutation(by_permutation, top_p, ws)
        assert torch.equal(by_value, want) and torch.equal(by_permutation, want)


def test_greedy_takes_the_first_of_equal_maxima():
    logits = torch.tensor([[1.0, 4.0, 4.0, 2.0], [0.0, -0.0, 0.0, -1.0], [-3.0, -1.0, -2.0, -1.0]])
    greedy = [SamplerState.from_params(SamplingParams(temperature=0.0), []) for _ in range(3)]
    assert sample_batch(logits, greedy, [None] * 3)[0] == [1, 0, 1] == torch.argmax(logits, dim=-1).tolist()
    mixed = greedy[:2] + [SamplerState.from_params(SamplingParams(temperature=0.0, presence_penalty=0.5), [])]
    assert sample_batch(logits, mixed, [None] * 3)[0] == [1, 0, 1]


def _splitmix64_uniform(key: int, i: int) -> float:
    m = (1 << 64) - 1
    z = (key + i * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return ((z >> 11) + 0.5) * 2.0 ** -53


def test_race_uniforms_are_splitmix64_of_the_key_and_the_id():
    """torch's int64 products wrap as uint64 ones do, and the masked shifts are logical ones."""
    ids = torch.tensor([0, 1, 2, 7, 1000, 65535, 248319])
    for key in (0, 1, 12_345_678_901_234, 2 ** 53 - 1):
        assert race_uniforms(key, ids).tolist() == [_splitmix64_uniform(key, i) for i in ids.tolist()]


def test_a_draw_over_the_kept_ids_picks_what_the_whole_row_picks():
    """An id's uniform depends on the key and the id alone, so racing only the ids a filter kept (top-k's,
    or a row mostly at -inf) gives the whole row's winner."""
    vocab = 4096
    ws = SamplerWorkspace(vocab)
    gen = torch.Generator().manual_seed(0)
    for seed in range(50):
        row = torch.randn(vocab, generator=gen)
        kept = torch.topk(row, 40).indices.sort().values
        cut = torch.full((vocab,), float("-inf"))
        cut[kept] = row[kept]
        full_ws = SamplerWorkspace(vocab)  # the whole-row path: kept unknown, most of the row finite
        picks = {draw(cut.clone(), torch.Generator().manual_seed(seed), kept, ws),
                 draw(cut.clone(), torch.Generator().manual_seed(seed), None, ws)}
        whole = row.clone()
        whole[cut == float("-inf")] = -1e30  # finite, never winning: forces the race over every id
        picks.add(draw(whole, torch.Generator().manual_seed(seed), None, full_ws))
        assert len(picks) == 1 and picks <= set(kept.tolist())


def test_a_seeded_draw_holds_when_the_logits_move_by_a_rounding_error():
    """A resumed prefill or another batch size moves logits by rounding errors; a seeded draw must not care.
    Over a broad 248K-id distribution and 200 seeds, logits moved by up to 1e-4 pick the same ids (the
    inverse-cdf walk in token-id order this replaced picked another id for 2 of these 200 seeds)."""
    vocab = 248_320
    ws = SamplerWorkspace(vocab)
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(vocab, generator=gen)
    moved = row + (torch.rand(vocab, generator=gen) - 0.5) * 2e-4
    changed = [s for s in range(200) if draw(row.clone(), torch.Generator().manual_seed(s), None, ws)
               != draw(moved.clone(), torch.Generator().manual_seed(s), None, ws)]
    assert changed == []
