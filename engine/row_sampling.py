"""Sampling a round's rows so that one request's failure ends only that request.

The batch is sampled in one call (``engine.sampling.sample_batch``), each
row guarded: a row that raises, or has no sampler state (its set-up failed),
gets placeholder token 0 and an error message; the scheduler ends that
request with "error" and drops the placeholder (``RoundResult.errors``), and
every other row keeps the token it would have drawn without it (each row's
draw depends only on its own sampler state, drawn once: a seeded request
beside a failing one answers as it does alone).
"""

from __future__ import annotations

import logging

import torch

from ignis.engine.sampling import NoTokenLeft, SamplerState, SamplerWorkspace, TokenLogprobs, sample_batch

log = logging.getLogger("ignis.engine")


def sample_isolated(rows: torch.Tensor, ids: list[str], states: list[SamplerState | None],
                    want_logprobs: list[int | None], workspace: SamplerWorkspace, invalid: set[str] | None = None
                    ) -> tuple[list[int], list[TokenLogprobs | None], dict[str, str]]:
    """Tokens and logprobs for ``rows`` [B, V] (fp32, CPU), and {request id: error} for the rows that failed;
    those whose own constraints left no token are added to ``invalid`` (the client's error)."""
    failed: dict[int, Exception] = {}
    have = [i for i, st in enumerate(states) if st is not None]
    if len(have) == len(states):
        tokens, lps = sample_batch(rows, states, want_logprobs, workspace, failed)
    else:
        tokens, lps = [0] * len(states), [None] * len(states)
        for i, st in enumerate(states):
            if st is None:
                failed[i] = LookupError("it has no sampler state (its set-up failed)")
        if have:
            failed_of_have: dict[int, Exception] = {}
            picked, picked_lps = sample_batch(rows[have], [states[i] for i in have], [want_logprobs[i] for i in have],
                                              workspace, failed_of_have)
            for j, i in enumerate(have):
                tokens[i], lps[i] = picked[j], picked_lps[j]
            failed.update({have[j]: exc for j, exc in failed_of_have.items()})
    errors = {}
    for i, exc in sorted(failed.items()):  # these requests end with an error; the others and the loop go on
        log.error("request %s: sampling its token failed; it ends with an error", ids[i],
                  exc_info=None if isinstance(exc, NoTokenLeft) else exc)
        errors[ids[i]] = str(exc) if isinstance(exc, NoTokenLeft) else f"engine error while sampling its token: {exc}"
        if isinstance(exc, NoTokenLeft) and invalid is not None:
            invalid.add(ids[i])
    return tokens, lps, errors
