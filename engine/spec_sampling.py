"""Rejection sampling for speculative decoding: a sampled request keeps its output distribution.

For a drafting lane whose request samples (temperature > 0, unpenalised),
each draft d_i was drawn from q_i, the head's distribution after the
request's own temperature and top-k / top-p / min-p (``processed_probs``).
The model's distribution at the position before it, processed the same
way, is p_i. ``verify_sampled`` keeps d_i with probability
min(1, p_i(d_i) / q_i(d_i)); the first rejected position draws from the
normalised residual max(0, p_i - q_i) and ends the step; with every draft
kept, one more token is drawn from the last position's p. Every token
emitted is then distributed exactly as p at its position (the standard
speculative-sampling argument), so the output distribution is unchanged.

Every draw uses the request's own generator; how many uniforms a step
takes depends on its drafts, which depend on what the head has seen (a
resumed prompt, the batch's room), so this is for unseeded requests only.

A seeded request is verified by the race instead (``verify_raced``): plain
decode draws output token n as the winner of a Gumbel-max race over the
processed row under the key of its generator's n-th uniform
(``sampling_steps.draw``). The head drafts position n by the same race over
its own processed row under that same key (``peek_race_keys``), and
verification keeps a draft exactly when it is the target's winner there;
the first position whose draft is not, or the one after the last draft,
gives the target's winner. Each token emitted takes one uniform, as in plain
decode, and is the token plain decode would draw: a seeded request gives the
same tokens with speculation on or off, whatever was drafted (but for the
near ties the plain sampler has too). The price is acceptance: a draft is
kept with the probability that the two races agree, at most the
min(p, q) mass that rejection sampling keeps.
"""

from __future__ import annotations

import torch

from ignis.engine.sampling_steps import SamplerWorkspace, draw_keyed, filter_row, race_key
from ignis.shared.sampling import SamplingParams


def _filtered_row(logits: torch.Tensor, params: SamplingParams, ws: SamplerWorkspace,
                  vocab_limit: int | None):
    """One row of logits in ``ws.row``, past ``vocab_limit`` masked, filtered as the plain sampler does;
    returns the row and ``filter_row``'s kept count."""
    row = ws.row
    row.copy_(logits)
    if vocab_limit is not None and vocab_limit < row.shape[0]:
        row[vocab_limit:] = float("-inf")
    return row, filter_row(row, params, ws)


def processed_probs(logits: torch.Tensor, params: SamplingParams, ws: SamplerWorkspace,
                    vocab_limit: int | None = None) -> torch.Tensor:
    """The fp64 distribution [V] a request samples from, given one row of logits (any device)."""
    row, _ = _filtered_row(logits, params, ws, vocab_limit)
    return torch.softmax(row.double(), dim=-1)


def raced(sampler) -> bool:
    """Whether a sampling request's drafts are verified by the race (seeded) or by rejection sampling."""
    return sampler.params.seed is not None


def race_row(logits: torch.Tensor, params: SamplingParams, ws: SamplerWorkspace, key: int,
             vocab_limit: int | None = None) -> int:
    """The winner of the race under ``key`` over one row of logits processed as the plain sampler does."""
    row, kept = _filtered_row(logits, params, ws, vocab_limit)
    return draw_keyed(row, key, kept, ws)


def verify_raced(first: int, row_at, drafts: list[int], params: SamplingParams, ws: SamplerWorkspace,
                 generator: torch.Generator, vocab_limit: int | None = None) -> list[int]:
    """A seeded request's tokens this step: ``first``, drawn from the round's first row by the plain sampler,
    then while the last token equals its draft, the race winner of the next verify row under the next
    uniform of ``generator`` (one per token emitted). ``row_at(i)``: the logits of row i >= 1 (masked as
    the plain sampler's would be), or None: the output ends there (a grammar ended)."""
    out = [first]
    for i, d in enumerate(drafts):
        if d != out[-1]:
            break
        row = row_at(i + 1)
        if row is None:
            break
        out.append(race_row(row, params, ws, race_key(generator), vocab_limit))
    return out


def draw_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One inverse-cdf draw from ``probs`` (need not be normalised): exactly one uniform."""
    cdf = probs.cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u.reshape(1), right=True)[0]), probs.shape[0] - 1)


def verify_sampled(p_rows, q_rows: list, drafts: list[int], generator: torch.Generator) -> list[int]:
    """The step's tokens: the kept drafts, then one drawn token. ``p_rows``: one more than drafts, or a callable
    ``p(i)`` asked for row i only once drafts 0 .. i-1 were kept (a grammar masks row i by the tokens before it:
    ``engine.grammar_lanes``); it may return None: the output ends after those drafts (the grammar ended). A
    ``q_rows`` entry None is a point mass on its draft (a drafter without a distribution: prompt lookup)."""
    p_at = p_rows if callable(p_rows) else p_rows.__getitem__
    out: list[int] = []
    for i, (q, d) in enumerate(zip(q_rows, drafts)):
        p = p_at(i)
        if p is None:
            return out
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u * (1.0 if q is None else float(q[d])) < float(p[d]):  # kept with probability min(1, p(d) / q(d))
            out.append(d)
            continue
        if q is None:  # max(p - q, 0) of a point mass: p without d
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - q).clamp_(min=0.0)
        out.append(draw_from(residual if float(residual.sum()) > 0 else p, generator))
        return out
    p = p_at(len(drafts))
    if p is not None:
        out.append(draw_from(p, generator))
    return out
