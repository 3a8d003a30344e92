"""Rejection sampling (engine.spec_sampling): tokens generated with drafts keep the model's distribution."""

from __future__ import annotations

import torch

from ignis.engine.spec_sampling import draw_from, processed_probs, verify_sampled
from ignis.engine.sampling_steps import SamplerWorkspace
from ignis.shared.sampling import SamplingParams

V = 4
CHI2_DF15_P001 = 37.70  # chi-square quantile: 15 degrees of freedom, p = 0.001


def toy(seed: int):
    """A two-token 'model' over V ids: p0, p1[t0]; a drafter unlike it: q0, q1[d0]."""
    g = torch.Generator().manual_seed(seed)

    def dist(*shape):
        return torch.softmax(torch.randn(*shape, V, generator=g, dtype=torch.float64) * 1.5, -1)

    return dist(), dist(V), dist(), dist(V)


def two_tokens(p0, p1, q0, q1, k: int, gen: torch.Generator) -> tuple[int, int]:
    """Generate two tokens the way the engine does: steps of k drafts (k = 0: plain draws)."""
    if k == 0:
        t0 = draw_from(p0, gen)
        return t0, draw_from(p1[t0], gen)
    d0 = draw_from(q0, gen)
    drafts, qs = [d0], [q0]
    if k > 1:
        drafts.append(draw_from(q1[d0], gen))
        qs.append(q1[d0])
    ps = [p0, p1[d0], p1[d0]][: len(drafts) + 1]  # the bonus row past two tokens is never used here
    out = verify_sampled(ps, qs, drafts, gen)
    if len(out) >= 2:
        return out[0], out[1]
    t0 = out[0]  # the step ended at one token: the next step drafts from t0's context
    d1 = draw_from(q1[t0], gen)
    return t0, verify_sampled([p1[t0], p1[t0]], [q1[t0]], [d1], gen)[0]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_two_token_joint_distribution_is_the_models_for_k_1_and_2():
    p0, p1, q0, q1 = toy(3)
    joint = (p0[:, None] * p1).flatten()
    n = 4000
    for k in (1, 2):
        gen = torch.Generator().manual_seed(100 + k)
        counts = torch.zeros(V * V, dtype=torch.float64)
        for _ in range(n):
            a, b = two_tokens(p0, p1, q0, q1, k, gen)
            counts[a * V + b] += 1
        assert chi_square(counts, joint) < CHI2_DF15_P001, (k, counts.tolist())


def test_a_biased_verifier_fails_the_same_check():
    """The check has teeth: always keeping the draft gives the drafter's distribution, which it rejects."""
    p0, p1, q0, q1 = toy(3)
    joint = (p0[:, None] * p1).flatten()
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(V * V, dtype=torch.float64)
    for _ in range(4000):
        a = draw_from(q0, gen)
        counts[a * V + draw_from(q1[a], gen)] += 1
    assert chi_square(counts, joint) > CHI2_DF15_P001


def test_same_seed_same_tokens():
    p0, p1, q0, q1 = toy(5)
    runs = [[two_tokens(p0, p1, q0, q1, 2, torch.Generator().manual_seed(11)) for _ in range(3)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_processed_probs_follow_the_requests_filters():
    ws = SamplerWorkspace(6)
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, 5.0])
    p = processed_probs(logits, SamplingParams(temperature=0.5, top_k=2), ws, vocab_limit=5)
    assert p[5] == 0 and set(torch.nonzero(p).flatten().tolist()) == {0, 1}
    assert abs(float(p[0] / p[1]) - float(torch.exp(torch.tensor(2.0)))) < 1e-6


def test_point_mass_drafts_keep_the_models_distribution():
    """Prompt lookup's drafts are fixed tokens (q = None, a point mass): kept with probability p(d), a
    rejection draws from p without d; the two-token joint is still the model's, for a draft the model
    favours and one it does not."""
    p0, p1, _, _ = toy(3)
    joint = (p0[:, None] * p1).flatten()
    for drafts in ([int(p0.argmax()), 1], [int(p0.argmin()), 2]):
        gen = torch.Generator().manual_seed(31)
        counts = torch.zeros(V * V, dtype=torch.float64)
        for _ in range(4000):
            out = verify_sampled([p0, p1[drafts[0]], p1[drafts[0]]], [None, None], drafts, gen)
            if len(out) < 2:
                out.append(verify_sampled([p1[out[0]]], [], [], gen)[0])
            counts[out[0] * V + out[1]] += 1
        assert chi_square(counts, joint) < CHI2_DF15_P001, (drafts, counts.tolist())


def test_rows_masked_by_the_tokens_before_them_keep_the_constrained_distribution():
    """A grammar's rows: row 0 masked by the state before the step, row 1 by the state after token 0
    (``p_at``, asked only once draft 0 is kept). A toy grammar bans token 0 first and, after an odd
    token, every even one; the two-token joint must be the masked model's, with head-like drafts (drawn
    from an unmasked q, so some are banned) and with point-mass drafts."""
    p0, p1, q0, q1 = toy(3)

    def masked(p, banned):
        out = p.clone()
        out[list(banned)] = 0.0
        return out / out.sum()

    def banned_after(t):
        return {0, 2} if t % 2 else set()

    joint = torch.zeros(V * V, dtype=torch.float64)
    m0 = masked(p0, {0})
    for a in range(V):
        joint[a * V: (a + 1) * V] = m0[a] * masked(p1[a], banned_after(a))
    for point in (False, True):
        gen = torch.Generator().manual_seed(41)
        counts = torch.zeros(V * V, dtype=torch.float64)
        for _ in range(4000):
            d0 = 1 if point else draw_from(q0, gen)
            d1 = 3 if point else draw_from(q1[d0], gen)
            rows = [lambda: masked(p0, {0}), lambda: masked(p1[d0], banned_after(d0)),
                    lambda: masked(p1[d0], banned_after(d0))]  # row 2 (past two tokens) is never read here
            out = verify_sampled(lambda i: rows[i](), [None, None] if point else [q0, q1[d0]], [d0, d1], gen)
            if len(out) < 2:
                out.append(draw_from(masked(p1[out[0]], banned_after(out[0])), gen))
            counts[out[0] * V + out[1]] += 1
        assert chi_square(counts[joint > 0], joint[joint > 0]) < CHI2_DF15_P001, (point, counts.tolist())
        assert counts[joint == 0].sum() == 0  # a banned token never comes out


def test_the_race_verification_gives_plain_decodes_tokens_whatever_was_drafted():
    """verify_raced over rows p_0 .. p_K: the tokens are those plain decode draws one by one with the same
    generator (each the race of its row under the next uniform), drafts only decide how many come out, and
    the generator ends where plain decode's would after that many tokens."""
    from ignis.engine.sampling_steps import SamplerWorkspace, peek_race_keys, race_key
    from ignis.engine.spec_sampling import race_row, verify_raced
    from ignis.shared.sampling import SamplingParams

    V, K = 64, 3
    params = SamplingParams(temperature=0.9, top_p=0.9)
    ws = SamplerWorkspace(V)
    rows = torch.randn(K + 1, V, generator=torch.Generator().manual_seed(3)) * 3
    for seed in range(40):
        plain_gen = torch.Generator().manual_seed(seed)
        plain = [race_row(rows[i], params, ws, race_key(plain_gen)) for i in range(K + 1)]
        gen = torch.Generator().manual_seed(seed)
        keys = peek_race_keys(gen, K)
        drafted = [race_row(rows[i] + torch.randn(V, generator=torch.Generator().manual_seed(seed + i)) * 0.5,
                            params, ws, keys[i]) for i in range(K)]  # a head close to the target
        for drafts in (drafted, plain[:K], [plain[0], (plain[1] + 1) % V, plain[2]], []):
            g = torch.Generator().manual_seed(seed)
            first = race_row(rows[0], params, ws, race_key(g))  # the runner's draw of the first token
            out = verify_raced(first, lambda i: rows[i], drafts, params, ws, g)
            n = 0
            while n < len(drafts) and drafts[n] == plain[n]:
                n += 1
            assert out == plain[:n + 1], (seed, drafts)
            again = torch.Generator().manual_seed(seed)
            for _ in out:
                race_key(again)
            assert torch.equal(g.get_state(), again.get_state())  # one uniform per token out
