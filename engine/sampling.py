"""Token sampling: penalties, temperature, top-k/top-p/min-p, seeded draws, logprobs.

Each request owns a :class:`SamplerState`: its torch generator (seeded from
``seed`` or from the OS), and the counts of the tokens it produced. The
generator advances by exactly one uniform draw per sampled token, whatever
the batch around it, so a seeded request is reproducible across runs and
batch mixes, and its generator state can be saved and restored with the rest
of the sequence state (``snapshot`` / ``restore``).

Penalties follow the usual server conventions: repetition (divide positive
logits, multiply negative ones) over prompt and output tokens; presence and
frequency (subtract) over output tokens only. Logprobs are those of the raw
model distribution, before penalties and temperature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ignis.shared.sampling import SamplingParams


@dataclass
class SamplerState:
    """Per-request sampling state that travels with the sequence: the request's params (as sent), its
    generator, and the tokens the penalties look at."""

    params: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator = field(default=None, repr=False)
    prompt_tokens: set = field(default_factory=set, repr=False)
    output_counts: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.generator is None:
            self.generator = torch.Generator(device="cpu")
            seed = self.params.seed
            self.generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)

    @classmethod
    def from_params(cls, params: SamplingParams, prompt: list[int]) -> "SamplerState":
        state = cls(params)
        if params.repetition_penalty != 1.0:
            state.prompt_tokens = set(prompt)
        return state

    @property
    def greedy(self) -> bool:
        return self.params.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        return (self.params.presence_penalty != 0.0 or self.params.frequency_penalty != 0.0
                or self.params.repetition_penalty != 1.0)

    def record(self, token: int) -> None:
        self.output_counts[token] = self.output_counts.get(token, 0) + 1

    def snapshot(self) -> dict:
        """Everything needed to resume sampling bit-exact."""
        return {
            "rng": self.generator.get_state().clone(),
            "output_counts": dict(self.output_counts),
        }

    def restore(self, snap: dict) -> None:
        self.generator.set_state(snap["rng"])
        self.output_counts = dict(snap["output_counts"])


def _apply_penalties(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    rp = st.params.repetition_penalty
    if rp != 1.0:
        seen = st.prompt_tokens | set(st.output_counts)
        if seen:
            idx = torch.tensor(sorted(seen), dtype=torch.long, device=row.device)
            vals = row[idx]
            row[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if st.output_counts and (st.params.presence_penalty or st.params.frequency_penalty):
        idx = torch.tensor(list(st.output_counts), dtype=torch.long, device=row.device)
        counts = torch.tensor(list(st.output_counts.values()), dtype=row.dtype, device=row.device)
        row[idx] -= st.params.frequency_penalty * counts + st.params.presence_penalty
    return row


def _filter(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """Temperature-scaled logits with disallowed tokens at -inf."""
    row = row / st.params.temperature
    vocab = row.shape[-1]
    if 0 < st.params.top_k < vocab:
        kth = torch.topk(row, st.params.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if st.params.min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row = row.masked_fill(probs < st.params.min_p * probs.max(), float("-inf"))
    if st.params.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= st.params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        row = row.masked_fill(drop, float("-inf"))
    return row


def sample_row(logits: torch.Tensor, st: SamplerState) -> int:
    """Sample one token from one row of fp32 logits [V] (modified in place)."""
    if st.penalised:
        logits = _apply_penalties(logits, st)
    if st.greedy:
        return int(torch.argmax(logits))
    row = _filter(logits, st)
    probs = torch.softmax(row, dim=-1, dtype=torch.float64)
    cdf = probs.cumsum(-1)
    u = torch.rand((), generator=st.generator, dtype=torch.float64) * cdf[-1]
    token = int(torch.searchsorted(cdf, u.reshape(1), right=True)[0])
    return min(token, int(probs.shape[-1]) - 1)


@dataclass
class TokenLogprobs:
    token_logprob: float
    top: list[tuple[int, float]]


def sample_batch(logits: torch.Tensor, states: list[SamplerState],
                 want_logprobs: list[int | None]) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Sample one token per row of logits [B, V].

    ``want_logprobs[i]`` is None (no logprobs) or the number of top
    alternatives to report for row i.
    """
    logits = logits.float()
    need_lp = any(w is not None for w in want_logprobs)
    logp = torch.log_softmax(logits, dim=-1) if need_lp else None
    all_greedy = all(st.greedy and not st.penalised for st in states)
    if all_greedy:
        tokens = torch.argmax(logits, dim=-1).tolist()
    else:
        work = logits.clone()
        tokens = [sample_row(work[i], st) for i, st in enumerate(states)]
    lps: list[TokenLogprobs | None] = []
    for i, (tok, st) in enumerate(zip(tokens, states)):
        st.record(tok)
        k = want_logprobs[i]
        if k is None:
            lps.append(None)
            continue
        row = logp[i]
        top = []
        if k > 0:
            vals, idx = torch.topk(row, min(k, row.shape[-1]))
            top = list(zip(idx.tolist(), vals.tolist()))
        lps.append(TokenLogprobs(token_logprob=float(row[tok]), top=top))
    return tokens, lps
