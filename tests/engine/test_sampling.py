"""The sampler: penalties, filters, seeded draws and their snapshot, on hand-made logits."""

from __future__ import annotations

import torch

from ignis.engine.sampling import SamplerState, sample_batch
from ignis.shared.sampling import SamplingParams


def state(prompt=(), **params) -> SamplerState:
    return SamplerState.from_params(SamplingParams(**params), list(prompt))


def test_greedy_takes_the_argmax_and_reports_raw_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, -1.0, 0.5]])
    tokens, lps = sample_batch(logits, [state(temperature=0), state(temperature=0)], [1, None])
    assert tokens == [1, 0]
    assert abs(lps[0].token_logprob - float(torch.log_softmax(logits[0], -1)[1])) < 1e-6
    assert lps[0].top[0][0] == 1 and lps[1] is None


def test_a_tiny_temperature_picks_the_argmax_as_vllm_takes_it():
    # logits / 1e-39 overflow to inf: the race among several inf entries took the lowest id, not the largest
    logits = torch.tensor([[1.0, 2.0, 30.0, 29.0]])
    for t in (1e-39, 1e-7, 1e-3):
        for seed in range(10):
            assert sample_batch(logits.clone(), [state(temperature=t, seed=seed)], [None])[0] == [2]
    assert SamplingParams(temperature=1e-6).greedy and SamplingParams(temperature=1e-3).temperature == 0.01
    assert SamplingParams(temperature=0.5).temperature == 0.5


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    # token 0 (3.0, in the prompt) falls to 1.0 under penalty 3, below token 2 (2.0)
    st = state(prompt=[0, 1], temperature=0, repetition_penalty=3.0)
    tokens, _ = sample_batch(torch.tensor([[3.0, -1.0, 2.0]]), [st], [None])
    assert tokens == [2]
    assert st.output_counts == {2: 1}


def test_presence_and_frequency_penalties_count_output_tokens_only():
    st = state(prompt=[1], temperature=0, frequency_penalty=1.5)
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    assert sample_batch(logits.clone(), [st], [None])[0] == [0]
    assert sample_batch(logits.clone(), [st], [None])[0] == [1]  # 2.0 - 1.5 < 1.9; the prompt's 1 is not penalised


def test_top_k_one_is_greedy_and_min_p_drops_the_tail():
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]])
    for seed in range(20):
        assert sample_batch(logits.clone(), [state(temperature=1.0, top_k=1, seed=seed)], [None])[0] == [1]
        tok = sample_batch(logits.clone(), [state(temperature=1.0, min_p=0.5, seed=seed)], [None])[0][0]
        assert tok in (1, 2)


def test_a_seed_reproduces_and_a_snapshot_resumes_the_same_draws():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    a, b = state(temperature=1.0, seed=11), state(temperature=1.0, seed=11)
    first = [sample_batch(logits.clone(), [a], [None])[0][0] for _ in range(5)]
    assert first == [sample_batch(logits.clone(), [b], [None])[0][0] for _ in range(5)]
    snap = a.snapshot()
    later = [sample_batch(logits.clone(), [a], [None])[0][0] for _ in range(5)]
    a.restore(snap)
    assert later == [sample_batch(logits.clone(), [a], [None])[0][0] for _ in range(5)]
    assert len(set(first + later)) > 1  # it does draw


def test_logit_bias_is_added_before_the_pick_and_logprobs_stay_raw():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    st = state(temperature=0, logit_bias=((1, 1.5), (3, 100.0)))
    tokens, lps = sample_batch(logits.clone(), [st], [2])
    assert tokens == [3]  # 0.0 + 100 beats 2.0, and 1.0 + 1.5 too
    assert abs(lps[0].token_logprob - float(torch.log_softmax(logits[0], -1)[3])) < 1e-6
    assert [t for t, _ in lps[0].top] == [0, 1]  # the raw distribution's order
    banned = state(temperature=1.0, seed=3, logit_bias=((0, -100.0), (1, -100.0)))
    assert all(sample_batch(logits.clone(), [banned], [None])[0][0] in (2, 3) for _ in range(50))
    assert state(temperature=0, logit_bias=((0, -1.5),)).adjusted


def test_allowed_token_ids_are_the_only_ids_drawn_and_logprobs_stay_raw():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    st = state(temperature=0, allowed_token_ids=(2, 4))
    tokens, lps = sample_batch(logits.clone(), [st], [2])
    assert tokens == [2] and st.adjusted and st.adjusts_now
    assert abs(lps[0].token_logprob - float(torch.log_softmax(logits[0], -1)[2])) < 1e-6
    assert [t for t, _ in lps[0].top] == [0, 1]  # the raw distribution's order
    sampled = state(temperature=1.5, seed=5, allowed_token_ids=(1, 3, 4))
    draws = {sample_batch(logits.clone(), [sampled], [None])[0][0] for _ in range(200)}
    assert draws == {1, 3, 4}
    # the bias acts among the allowed ids only
    biased = state(temperature=0, allowed_token_ids=(3, 4), logit_bias=((0, 50.0), (4, 5.0)))
    assert sample_batch(logits.clone(), [biased], [None])[0] == [4]


def test_bad_words_ban_exactly_the_ids_their_prefixes_reach_and_logprobs_stay_raw():
    # ids 0..5; greedy order 0 > 1 > 2 > ...; bad words: (0,) always, (1, 2) then (2, 1, 3)
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    st = state(temperature=0, bad_words=((0,), (1, 2), (2, 1, 3)))
    assert st.adjusted and st.adjusts_now and st.recent.maxlen == 2
    tokens, lps = sample_batch(logits.clone(), [st], [1])
    assert tokens == [1]  # 0 is banned at every step
    assert abs(lps[0].token_logprob - float(torch.log_softmax(logits[0], -1)[1])) < 1e-6
    assert lps[0].top[0][0] == 0  # the raw distribution's best, though banned
    assert sample_batch(logits.clone(), [st], [None])[0] == [1]  # after 1, the word (1, 2) bans 2: 1 again
    follow = torch.tensor([[5.0, 1.0, 4.0, 3.0, 2.0, 0.0]])  # the greedy order is now 0, 2, 3, ...
    assert sample_batch(follow.clone(), [st], [None])[0] == [3]  # 0 and 2 (after 1) banned
    assert list(st.recent) == [1, 3]
    # (2, 1, 3): 3 is banned only once the output ends with 2, 1
    tail = state(temperature=0, bad_words=((2, 1, 3),))
    for token in (2, 1):
        tail.record(token)
    assert sample_batch(torch.tensor([[0.0, 0.0, 0.0, 9.0, 8.0]]), [tail], [None])[0] == [4]
    assert sample_batch(torch.tensor([[0.0, 0.0, 0.0, 9.0, 8.0]]), [tail], [None])[0] == [3]
    # sampled: the banned id is never drawn; a snapshot keeps the tail
    sampled = state(temperature=2.0, seed=1, bad_words=((1, 1),))
    draws = set()
    for _ in range(200):
        sampled.record(1)
        draws.add(sample_batch(torch.zeros(1, 3), [sampled], [None])[0][0])
    assert draws == {0, 2}
    snap = sampled.snapshot()  # the tail ends with the last draw (0 or 2)
    sampled.record(1)
    sampled.restore(snap)
    assert len(sampled.recent) == 1 and sampled.recent[-1] in (0, 2)
    # an id past the row can never be drawn: no error
    assert sample_batch(logits.clone(), [state(temperature=0, bad_words=((99,), (0,)))], [None])[0] == [1]


def test_min_tokens_holds_back_stop_and_eos_ids_until_they_are_out():
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0]])  # 2 is EOS, 3 a stop id, 1 the best of the rest
    st = SamplerState.from_params(SamplingParams(temperature=0, min_tokens=2, max_tokens=8, stop_token_ids=(3,)),
                                  [], eos_ids=(2,))
    picks = [sample_batch(logits.clone(), [st], [None])[0][0] for _ in range(3)]
    assert picks == [1, 1, 2] and st.produced == 3 and not st.adjusts_now
    free = SamplerState.from_params(SamplingParams(temperature=0, min_tokens=2, max_tokens=8, ignore_eos=True,
                                                   stop_token_ids=(3,)), [], eos_ids=(2,))
    assert free.held_ids == (3,) and sample_batch(logits.clone(), [free], [None])[0] == [2]
    snap = st.snapshot()
    st.record(0)
    st.restore(snap)
    assert st.produced == 3


def _thinking(**params) -> SamplerState:
    """A request whose prompt opened a thinking block of budget 2; ids 0..5, the forced end (3, 5, 4)."""
    return state(thinking_budget=2, thinking_open=True, think_start_id=2, think_end_id=5, thinking_end_ids=(3, 5, 4),
                 **params)


def test_a_thinking_budget_forces_its_end_greedy_and_sampled_and_logprobs_stay_raw():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])  # the end ids are never the model's pick
    raw = torch.log_softmax(logits[0], -1)
    greedy = _thinking(temperature=0)
    assert greedy.adjusted and not greedy.adjusts_now  # no draft, yet the free steps are plain
    picks, lps = [], []
    for _ in range(7):
        tokens, lp = sample_batch(logits.clone(), [greedy], [2])
        picks += tokens
        lps += lp
    assert picks == [0, 0, 3, 5, 4, 0, 0]
    for token, lp in zip(picks, lps):
        assert abs(lp.token_logprob - float(raw[token])) < 1e-6 and lp.top[0][0] == 0
    for seed in range(20):  # sampled with a seed, at a temperature that would rarely pick them
        sampled = _thinking(temperature=0.3, seed=seed, top_p=0.9)
        picks = [sample_batch(logits.clone(), [sampled], [None])[0][0] for _ in range(6)]
        assert picks[2:5] == [3, 5, 4] and 5 not in picks[:2]


def test_a_thinking_budget_forces_over_every_other_setting():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    st = _thinking(temperature=0, allowed_token_ids=(0, 1), bad_words=((3,),), logit_bias=((5, -100.0),))
    assert [sample_batch(logits.clone(), [st], [None])[0][0] for _ in range(6)] == [0, 0, 3, 5, 4, 0]


def test_a_snapshot_keeps_where_the_thinking_budget_stands():
    logits = torch.zeros(1, 6)
    st = _thinking(temperature=1.0, seed=4)
    for _ in range(3):  # two free draws (5 may close the block: then nothing is forced), then maybe a forced 3
        sample_batch(logits.clone(), [st], [None])
    snap = st.snapshot()
    later = [sample_batch(logits.clone(), [st], [None])[0][0] for _ in range(4)]
    st.restore(snap)
    assert [sample_batch(logits.clone(), [st], [None])[0][0] for _ in range(4)] == later
    seeded = _thinking(temperature=1.0, seed=1)  # its own first two draws are not 5, 4
    seeded.record(1)
    seeded.record(1)
    seeded.record(3)  # mid-forcing: 5 then 4 come next
    snap = seeded.snapshot()
    seeded.record(5)
    seeded.record(4)
    seeded.restore(snap)
    assert [sample_batch(logits.clone(), [seeded], [None])[0][0] for _ in range(2)] == [5, 4]


def test_penalty_indexes_kept_as_the_output_grows_equal_a_fresh_rebuild():
    """The penalties' indexes grow with the output instead of being rebuilt each step: at every step (and
    after a snapshot's restore) the penalised row equals one from a state built afresh with those counts."""
    from ignis.engine.sampling import _apply_penalties

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 50, (40,), generator=gen).tolist()
    params = dict(repetition_penalty=1.3, presence_penalty=0.7, frequency_penalty=0.4, temperature=1.0)
    st = state(prompt, **params)
    snap = None
    for step in range(120):
        row = torch.randn(64, generator=gen)
        fresh = state(prompt, **params)
        fresh.output_counts = dict(st.output_counts)
        got, want = row.clone(), row.clone()
        _apply_penalties(got, st)
        _apply_penalties(want, fresh)
        assert torch.equal(got, want), step
        st.record(int(torch.randint(0, 64, (1,), generator=gen)))
        if step == 60:
            snap = st.snapshot()
        if step == 90:
            st.restore(snap)
