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

Every draw uses the request's own generator, so a seeded request is
reproducible for a given ``--speculative-tokens`` (its draws differ from a
plain decode's, so its tokens do too).
"""

from __future__ import annotations

import torch

from ignis.engine.sampling_steps import SamplerWorkspace, filter_row
from ignis.shared.sampling import SamplingParams


def processed_probs(logits: torch.Tensor, params: SamplingParams, ws: SamplerWorkspace,
                    vocab_limit: int | None = None) -> torch.Tensor:
    """The fp64 distribution [V] a request samples from, given one row of logits (any device)."""
    row = ws.row
    row.copy_(logits)
    if vocab_limit is not None and vocab_limit < row.shape[0]:
        row[vocab_limit:] = float("-inf")
    filter_row(row, params, ws)
    return torch.softmax(row.double(), dim=-1)


def draw_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One inverse-cdf draw from ``probs`` (need not be normalised): exactly one uniform."""
    cdf = probs.cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u.reshape(1), right=True)[0]), probs.shape[0] - 1)


def verify_sampled(p_rows: list[torch.Tensor], q_rows: list[torch.Tensor], drafts: list[int],
                   generator: torch.Generator) -> list[int]:
    """The step's tokens: the kept drafts, then one drawn token. ``p_rows``: one more than drafts; a ``q_rows``
    entry None is a point mass on its draft (a drafter that proposes without a distribution: prompt lookup)."""
    out: list[int] = []
    for p, q, d in zip(p_rows, q_rows, drafts):
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
    out.append(draw_from(p_rows[len(drafts)], generator))
    return out
