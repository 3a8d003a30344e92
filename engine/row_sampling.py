"""Sampling a round's rows so that one request's failure ends only that request.

The batch is sampled in one call (``engine.sampling.sample_batch``). If that
raises, or a row has no sampler state (its set-up failed), the rows are
sampled one by one: a row that raises gets placeholder token 0 and an error
message; the scheduler ends that request with "error" and drops the
placeholder (``RoundResult.errors``), and every other row keeps the token it
would have drawn in the batch (each row's draw depends only on its own
sampler state).
"""

from __future__ import annotations

import logging

import torch

from ignis.engine.sampling import SamplerState, SamplerWorkspace, TokenLogprobs, sample_batch

log = logging.getLogger("ignis.engine")


def sample_isolated(rows: torch.Tensor, ids: list[str], states: list[SamplerState | None],
                    want_logprobs: list[int | None], workspace: SamplerWorkspace
                    ) -> tuple[list[int], list[TokenLogprobs | None], dict[str, str]]:
    """Tokens and logprobs for ``rows`` [B, V] (fp32, CPU), and {request id: error} for the rows that failed."""
    if all(st is not None for st in states):
        try:
            tokens, lps = sample_batch(rows, states, want_logprobs, workspace)
            return tokens, lps, {}
        except Exception:
            log.exception("sampling the round's batch failed: sampling its %d rows one by one", len(ids))
    tokens, lps, errors = [], [], {}
    for i, rid in enumerate(ids):
        try:
            if states[i] is None:
                raise LookupError("it has no sampler state (its set-up failed)")
            (token,), (lp,) = sample_batch(rows[i:i + 1], [states[i]], [want_logprobs[i]], workspace)
        except Exception as exc:  # this request ends with an error; the others and the loop go on
            log.exception("request %s: sampling its token failed; it ends with an error", rid)
            token, lp = 0, None
            errors[rid] = f"engine error while sampling its token: {exc}"
        tokens.append(token)
        lps.append(lp)
    return tokens, lps, errors
