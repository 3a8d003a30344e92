"""Speculative decoding (engine.spec_decode, engine.spec_round): greedy output identical to plain decode."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.engine.spec_driver import generate, load

VOCAB = 128
GREEDY = {"temperature": 0.0}


def prompts(seed: int, lengths=(5, 70, 23, 130, 9)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_random_head_greedy_output_is_plain_decode(checkpoint_factory, family):
    """A random head is mostly rejected: every round rolls lanes back; output must not change."""
    model, head = load(checkpoint_factory(family, mtp="full").path)
    ps = prompts(1)
    limits = [24, 7, 31, 2, 18]  # max_tokens cuts some lanes' drafts short
    want, _ = generate(model, head, ps, k=0, max_tokens=limits, sampling=GREEDY)
    for k in (1, 2, 3):
        got, accepted = generate(model, head, ps, k=k, max_tokens=limits, sampling=GREEDY)
        assert got == want, f"K={k}"
        assert accepted, "no speculative decode ran"


@pytest.fixture(scope="module")
def fitted(checkpoint_factory, tmp_path_factory):
    """Per family: a checkpoint whose head is fitted to the model's own greedy outputs, and its prompts."""
    from tests.engine.checkpoints import write_mtp
    from tests.engine.mtp_fit import fit_head
    from tests.engine.mtp_reference import text_config

    made = {}

    def get(family):
        if family not in made:
            src = checkpoint_factory(family, mtp="full").path
            dst = tmp_path_factory.mktemp("fitted") / family
            shutil.copytree(src, dst)
            model, head = load(dst)
            ps = prompts(7, lengths=(6, 11, 17, 30, 9, 40))
            outs, _ = generate(model, head, ps, k=0, max_tokens=40, sampling=GREEDY)
            seqs = [(p + outs[f"r{i}"], len(p)) for i, p in enumerate(ps)]
            fitted_head = fit_head(model, family, text_config(family), seqs)
            write_mtp(dst, fitted_head.checkpoint_tensors(text_config(family).get("num_experts", 0)), family,
                      torch.float32)
            made[family] = (dst, ps)
        return made[family]

    return get


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_fitted_head_accepts_long_runs_and_output_is_plain_decode(fitted, family):
    path, ps = fitted(family)
    model, head = load(path)
    limits = [40, 13, 40, 29, 40, 33]
    want, _ = generate(model, head, ps, k=0, max_tokens=limits, sampling=GREEDY)
    for k in (1, 2, 3):
        got, accepted = generate(model, head, ps, k=k, max_tokens=limits, sampling=GREEDY)
        assert got == want, f"K={k}"
        assert max(accepted) == k, f"K={k}: no decode accepted all its drafts"
        assert sum(accepted) / len(accepted) > 0.5 * k, f"K={k}: mean accepted {sum(accepted) / len(accepted)}"


@pytest.mark.parametrize("adjusted", [{"logit_bias": ((5, 2.5), (9, -100.0))}, {"min_tokens": 20},
                                      {"presence_penalty": 0.5}, {"allowed_token_ids": tuple(range(2, 300, 3))},
                                      {"bad_words": ((9,), (4, 5), (2, 3, 7))},
                                      {"thinking_budget": 3, "thinking_open": True, "think_end_id": 7,
                                       "thinking_end_ids": (5, 7, 9)}])
def test_requests_whose_logits_are_adjusted_step_plainly_with_plain_output(fitted, adjusted):
    """A logit bias, min_tokens, a penalty, allowed ids, bad words or a thinking budget change the logits the head's
    drafts would be checked against:
    such requests decode a token per step beside drafting ones, and their output is plain decode's."""
    path, ps = fitted("qwen3_5")
    model, head = load(path)
    sampling = {**GREEDY, **adjusted}
    want, _ = generate(model, head, ps[:3], k=0, max_tokens=30, sampling=sampling)
    got, accepted = generate(model, head, ps[:3], k=2, max_tokens=30, sampling=sampling)
    assert got == want and accepted == []
    _, accepted = generate(model, head, ps[:3], k=2, max_tokens=30, sampling=GREEDY)
    assert accepted  # the same prompts draft without the adjustment


@pytest.mark.parametrize("sampling", [dict(GREEDY), {"temperature": 0.7, "seed": 11}])
def test_requests_with_logprobs_draft_and_report_plain_decodes_logprobs(fitted, sampling):
    """Logprobs requests draft too: one logprob per token, from the verify row that decided it. Greedy:
    tokens and logprobs (and the top 3) equal plain decode's (fp32, 1e-5); sampled: one per token, and
    each equals the plain forward's distribution at that position (a greedy plain run over the same ids)."""
    path, ps = fitted("qwen3_5")
    model, head = load(path)
    asks = dict(sampling, logprobs=True, top_logprobs=3)
    want_lps, got_lps = {}, {}
    want, _ = generate(model, head, ps, k=0, max_tokens=30, sampling=asks, logprobs=want_lps)
    got, accepted = generate(model, head, ps, k=2, max_tokens=30, sampling=asks, logprobs=got_lps)
    assert sum(accepted) > 0, "logprobs requests did not draft"
    for rid, ids in got.items():
        assert len(got_lps[rid]) == len(ids), rid
    if sampling["temperature"] == 0.0:
        assert got == want
        for rid in want:
            for a, b in zip(got_lps[rid], want_lps[rid]):
                assert abs(a.token_logprob - b.token_logprob) < 1e-5, rid
                assert [i for i, _ in a.top] == [i for i, _ in b.top], rid
                assert all(abs(x - y) < 1e-5 for (_, x), (_, y) in zip(a.top, b.top)), rid
        return
    # sampled: each reported logprob is the plain forward's at that position (teacher-forced)
    for rid in ("r0", "r3"):
        p, out = ps[int(rid[1:])], got[rid]
        for j, token in enumerate(out):
            assert abs(got_lps[rid][j].token_logprob - row_logprob(model, p + out[:j], token)) < 1e-4, (rid, j)


def test_prompts_scored_beside_drafting_lanes_score_as_without_a_drafter(fitted):
    """A request scoring its prompt prefills while others draft: its scores come from the verify forward's
    rows and equal a plain engine's (fp32, 1e-5); the output is plain decode's, and drafts were accepted."""
    path, ps = fitted("qwen3_5")
    model, head = load(path)
    asks = dict(GREEDY, prompt_logprobs=2)
    want_scores, got_scores = {}, {}
    want, _ = generate(model, head, ps, k=0, max_tokens=30, sampling=asks, prompt_scores=want_scores, lanes=2)
    got, accepted = generate(model, head, ps, k=2, max_tokens=30, sampling=asks, prompt_scores=got_scores, lanes=2)
    assert sum(accepted) > 0 and got == want
    assert set(got_scores) == set(want_scores) == {f"r{i}" for i in range(len(ps))}
    for rid in want_scores:
        a = [x for m in got_scores[rid] for x in m.logprobs.logprobs]
        b = [x for m in want_scores[rid] for x in m.logprobs.logprobs]
        assert len(a) == len(b) == len(ps[int(rid[1:])]) - 1
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, rid
        assert [m.ranks for m in got_scores[rid]] == [m.ranks for m in want_scores[rid]]


def row_logprob(model, ids: list[int], token: int) -> float:
    """log p(token | ids) under the model's raw distribution (one plain forward over ``ids``)."""
    from tests.engine.mtp_fit import target_hidden

    logits = target_hidden(model, ids)[-1] @ model.head_weight().detach().float().T
    return float(torch.log_softmax(logits, -1)[token])


def test_speculative_tokens_without_a_drafter_fails_at_start(checkpoint_factory, tmp_path):
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    path = checkpoint_factory("qwen3_5", mtp=True).path  # two stray mtp.* tensors: no whole head
    config = EngineConfig(model=(str(path),), device="cpu", tierd_endpoint="off", runtime_dir=str(tmp_path),
                          kv_pool_tokens=256, decode_lanes=2, speculative_tokens=2)
    with pytest.raises(ValueError, match="--speculative-tokens 2: .* has no drafter to speculate with "
                                         r"\(the mtp.\* weights do not make a whole drafter"):
        load_runtime(config, "m", str(path))


def test_speculative_runtime_stamps_drafter_1(checkpoint_factory, tmp_path):
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    path = checkpoint_factory("qwen3_5", mtp="full").path
    stamps = {}
    for k in (0, 2):
        config = EngineConfig(model=(str(path),), device="cpu", tierd_endpoint="off", runtime_dir=str(tmp_path),
                              kv_pool_tokens=256, decode_lanes=2, speculative_tokens=k)
        runtime = load_runtime(config, "m", str(path))
        stamps[k] = runtime.scheduler.store.stamp
        assert (runtime.runner.spec is not None) == (k > 0)
        runtime.close()
    assert stamps[0].endswith(":drafter=0") and stamps[2].endswith(":drafter=1")
    assert stamps[0].rsplit(":", 1)[0] == stamps[2].rsplit(":", 1)[0]


def test_the_snapshot_reuses_memory_made_once_and_holds_the_lanes_state(checkpoint_factory, tmp_path):
    """The pre-verify snapshot is copied into one buffer made at the first snapshot (the memory plan
    sets it aside), never a fresh allocation per round."""
    from ignis.engine.config import EngineConfig
    from ignis.engine.runtime import load_runtime

    path = checkpoint_factory("qwen3_5", mtp="full").path
    config = EngineConfig(model=(str(path),), device="cpu", tierd_endpoint="off", runtime_dir=str(tmp_path),
                          kv_pool_tokens=256, decode_lanes=3, speculative_tokens=2)
    runtime = load_runtime(config, "m", str(path))
    spec, state = runtime.runner.spec, runtime.runner.state
    try:
        state.ssm.normal_()
        state.conv.normal_()
        ssm, conv = spec.snapshot([2, 0])
        assert torch.equal(ssm, state.ssm[:, [2, 0]]) and torch.equal(conv, state.conv[:, [2, 0]])
        first = (ssm.data_ptr(), conv.data_ptr())
        ssm, conv = spec.snapshot([1])
        assert (ssm.data_ptr(), conv.data_ptr()) == first and torch.equal(ssm, state.ssm[:, [1]])
    finally:
        runtime.close()


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_requests_resumed_from_retained_state_equal_cold_ones(fitted, family):
    """Prompt reuse with a drafter: later requests resume from the first one's retained prefix (the head
    starts its rows at the resume point) and answer as plain decode without reuse."""
    path, ps = fitted(family)
    model, head = load(path)
    base = ps[5] + ps[3] + ps[2] + ps[4] + ps[1]  # 107 tokens: whole pages and a partial one
    shared = [base + [5, 9], base + [5, 9, 11], base + [77]]
    cold, _ = generate(model, head, shared, k=0, max_tokens=30, sampling=GREEDY, lanes=1)
    events = {}
    got, accepted = generate(model, head, shared, k=2, max_tokens=30, sampling=GREEDY, lanes=1, reuse_slots=4,
                             events=events)
    assert got == cold
    assert any(ev.cached_tokens for ev in events.values()), "no request resumed from retained state"
    assert sum(accepted) > 0


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_seeded_sampled_requests_draft_and_give_plain_decodes_tokens(fitted, family):
    """A seeded request's drafts are verified by the races of plain decode (engine.spec_sampling): it
    accepts drafts, and its tokens are plain decode's with that seed whatever K, the batch, the room left
    by max_tokens, or a resume from retained state (where the head has no rows for the prefix)."""
    path, ps = fitted(family)
    model, head = load(path)
    sampling = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}
    plain, _ = generate(model, head, ps, k=0, max_tokens=30, sampling=sampling)
    accepted_any = 0
    for k, lanes in ((1, 8), (2, 8), (3, 2)):
        got, accepted = generate(model, head, ps, k=k, max_tokens=30, sampling=sampling, lanes=lanes)
        assert got == plain, (k, lanes)
        accepted_any += sum(accepted)
    assert accepted_any > 0
    short, _ = generate(model, head, ps, k=2, max_tokens=7, sampling=sampling)
    assert all(short[rid] == plain[rid][:7] for rid in plain)  # a cut is a prefix
    base = ps[5] + ps[3] + ps[2] + ps[4] + ps[1]
    shared = [base + [5, 9], base + [5, 9, 11], base + [77]]
    cold, _ = generate(model, head, shared, k=0, max_tokens=30, sampling=sampling, lanes=1)
    events = {}
    warm, _ = generate(model, head, shared, k=2, max_tokens=30, sampling=sampling, lanes=1, reuse_slots=4,
                       events=events)
    assert warm == cold and any(ev.cached_tokens for ev in events.values())
    other, _ = generate(model, head, ps, k=2, max_tokens=30, sampling=dict(sampling, seed=99))
    assert other != plain


def test_unseeded_sampled_requests_draft_by_rejection_sampling(fitted):
    """An unseeded sampled request's drafts are verified by rejection sampling (whose distribution test is
    tests/engine/test_spec_sampling.py): it accepts drafts."""
    path, ps = fitted("qwen3_5")
    model, head = load(path)
    _, accepted = generate(model, head, ps, k=2, max_tokens=30, sampling={"temperature": 0.7, "top_p": 0.95})
    assert sum(accepted) > 0


TEMPERATURE = 0.5


def chi2_quantile_999(df: int) -> float:
    """The chi-square distribution's 0.999 quantile (Wilson-Hilferty; within 1% from df 5 up)."""
    z = 3.090
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


@pytest.mark.long
@pytest.mark.skipif(os.environ.get("IGNIS_LONG_TESTS") != "1", reason="long mode: IGNIS_LONG_TESTS=1")
def test_sampled_speculation_keeps_the_second_tokens_distribution(fitted):
    """Through the engine (long mode: about 30 s): over 600 requests, the token sampled at the first decode
    step (drafted and verified with K = 2) follows the model's exact marginal sum_t p0(t) p1(. | t), by
    chi-square. The default suite checks the scheme itself: tests/engine/test_spec_sampling.py."""
    from ignis.engine.forward_batch import ForwardBatch, SeqChunk
    from ignis.engine.models.state import ModelState

    path, ps = fitted("qwen3_5")
    model, head = load(path)
    prompt = ps[2][:8]
    state = ModelState.allocate(model.cfg, num_pages=VOCAB + 1, lanes=VOCAB + 1, dtype=torch.float32)
    with torch.inference_mode():
        logits0 = model(ForwardBatch.build([SeqChunk(prompt, 0, [VOCAB], VOCAB)]), state)[0]
        rows = model(ForwardBatch.build([SeqChunk(prompt + [t], 0, [t], t) for t in range(VOCAB)]), state)
    p0 = torch.softmax(logits0.double() / TEMPERATURE, -1)
    expected = (p0[:, None] * torch.softmax(rows.double() / TEMPERATURE, -1)).sum(0)
    n = 600
    outs, accepted = generate(model, head, [prompt] * n, k=2, max_tokens=4, lanes=32, pages=40,
                              prefill_budget=512, sampling={"temperature": TEMPERATURE})
    assert sum(accepted) > 0
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for out in outs.values():
        counts[out[1]] += 1
    order = torch.argsort(expected, descending=True)
    big = [int(i) for i in order if expected[i] * n >= 5]
    small = [int(i) for i in order if expected[i] * n < 5]
    obs, exp = counts[big], expected[big] * n
    if small:  # the rare ids together, as one cell
        obs = torch.cat([obs, counts[small].sum().reshape(1)])
        exp = torch.cat([exp, expected[small].sum().reshape(1) * n])
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2_quantile_999(len(obs) - 1), (stat, len(obs))
