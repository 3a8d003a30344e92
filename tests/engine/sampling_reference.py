"""The sampler as one plain function per row: a fresh tensor at every step, the whole row sorted for top-p.

The engine's sampler must draw exactly what this draws, bit for bit, from the
same logits and the same generators. It is the straightforward form of the
rules in ``engine/sampling.py``: penalties, temperature, top-k, min-p, top-p
(ties in token-id order), a Gumbel-max race over the whole row keyed by one uniform, logprobs of the raw
rows.
"""

from __future__ import annotations

import torch

from ignis.engine.sampling import SamplerState, TokenLogprobs
from ignis.engine.sampling_steps import race_uniforms


def _penalise(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    row = row.clone()
    rp = st.params.repetition_penalty
    if rp != 1.0:
        seen = st.prompt_tokens | set(st.output_counts)
        if seen:
            idx = torch.tensor(sorted(seen), dtype=torch.long)
            vals = row[idx]
            row[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if st.output_counts and (st.params.presence_penalty or st.params.frequency_penalty):
        idx = torch.tensor(list(st.output_counts), dtype=torch.long)
        counts = torch.tensor(list(st.output_counts.values()), dtype=row.dtype)
        row[idx] -= st.params.frequency_penalty * counts + st.params.presence_penalty
    return row


def _filter(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    row = row / st.params.temperature
    if 0 < st.params.top_k < row.shape[-1]:
        kth = torch.topk(row, st.params.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if st.params.min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row = row.masked_fill(probs < st.params.min_p * probs.max(), float("-inf"))
    if st.params.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True, stable=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= st.params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        row = row.masked_fill(drop, float("-inf"))
    return row


def reference_row(logits: torch.Tensor, st: SamplerState) -> int:
    row = _penalise(logits, st) if st.penalised else logits
    if st.greedy:
        return int(torch.argmax(row))
    row = _filter(row, st)
    key = int(torch.rand((), generator=st.generator, dtype=torch.float64) * 2.0 ** 53)
    gumbel = -torch.log(-torch.log(race_uniforms(key, torch.arange(row.shape[-1]))))
    return int(torch.argmax(row.double() + gumbel))  # the Gumbel-max race, over the whole row


def reference_batch(logits: torch.Tensor, states: list[SamplerState],
                    want_logprobs: list[int | None]) -> tuple[list[int], list[TokenLogprobs | None]]:
    logp = torch.log_softmax(logits, dim=-1)
    tokens = [reference_row(logits[i], st) for i, st in enumerate(states)]
    lps: list[TokenLogprobs | None] = []
    for i, (tok, st) in enumerate(zip(tokens, states)):
        st.record(tok)
        k = want_logprobs[i]
        if k is None:
            lps.append(None)
            continue
        top = []
        if k > 0:
            vals, idx = torch.topk(logp[i], min(k, logits.shape[-1]))
            top = [(t, v) for t, v in zip(idx.tolist(), vals.tolist()) if v != float("-inf")]  # allowed tokens only
        lps.append(TokenLogprobs(token_logprob=float(logp[i, tok]), top=top))
    return tokens, lps
