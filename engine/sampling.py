"""Token sampling: penalties, temperature, top-k/top-p/min-p, seeded draws, logprobs.

Each request owns a :class:`SamplerState`: its torch generator (seeded from
``seed`` or from the OS), and the counts of the tokens it produced. The
generator advances by exactly one uniform draw per sampled token, whatever
the batch around it, and its generator state can be saved and restored with
the rest of the sequence state (``snapshot`` / ``restore``). That uniform keys
a Gumbel-max race over the row (``sampling_steps.draw``): logits that differ
by a rounding error (a batch of another size, a prompt resumed from reuse)
change the pick only where its two best scores tie that closely, so a seeded
request gives the same tokens across runs, batch mixes and cache hits but for
such near ties.

Before the filters a row may be adjusted, in this order: ids outside the
request's ``allowed_token_ids`` are set to -inf, and so are the ids its
``bad_words`` ban after the output so far (``bad_words.py``); its ``logit_bias`` is added;
penalties follow the usual server conventions: repetition (divide positive logits, multiply negative ones) over prompt and
output tokens, presence and frequency (subtract) over output tokens only;
while fewer than ``min_tokens`` tokens are out, the stop ids (``stop_token_ids``,
and the model's end-of-sequence ids unless ``ignore_eos``) are set to -inf.
A step where the request's thinking budget forces an id (``thinking_budget.py``)
skips all of that: every other id is -inf and the forced one 0, so greedy and
seeded draws pick it (a draw still takes its one uniform).
Logprobs are those of the raw model distribution, before any of that and
temperature; where the logits come
masked (a grammar's disallowed tokens at -inf, ``grammar_lanes.py``) that is
the masked distribution, and tokens at -inf are never listed as alternatives.

Rows are sampled one at a time in a :class:`SamplerWorkspace` of the
vocabulary's width that the runner keeps across rounds (the steps are in
``sampling_steps.py``), so a round at a 248K-token vocabulary allocates no
[lanes, vocab] (or [vocab]) tensor and never writes the logits it was given.
Among equal logits the lower token id ranks first (top-p's order).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import torch

from ignis.engine.bad_words import BadWords
from ignis.engine.sampling_steps import (
    NoTokenLeft,
    SamplerWorkspace,
    draw,
    filter_row,
    first_max,
    first_max_of_rows,
)
from ignis.engine.thinking_budget import ThinkingBudget
from ignis.shared.sampling import SamplingParams


@dataclass
class SamplerState:
    """Per-request sampling state that travels with the sequence: the request's params (as sent), its
    generator, and the tokens the penalties look at."""

    params: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator = field(default=None, repr=False)
    prompt_tokens: set = field(default_factory=set, repr=False)
    output_counts: dict = field(default_factory=dict, repr=False)
    produced: int = 0  # output tokens so far
    held_ids: tuple = ()  # ids held back until min_tokens are out (stop ids and, unless ignore_eos, EOS ids)
    allowed: torch.Tensor | None = field(default=None, repr=False)  # allowed_token_ids as an index, made once
    bad_words: BadWords | None = field(default=None, repr=False)
    recent: deque = field(default_factory=deque, repr=False)  # the latest output tokens bad_words look at
    thinking: ThinkingBudget | None = field(default=None, repr=False)  # where a thinking budget stands
    # the penalties' indexes, kept as the output grows (a rebuild a step cost milliseconds at long prompts):
    _seen: set | None = field(default=None, repr=False)  # prompt and output ids (repetition_penalty)
    _seen_idx: torch.Tensor | None = field(default=None, repr=False)
    _seen_new: list = field(default_factory=list, repr=False)  # ids seen since the index was last grown
    _out_pos: dict | None = field(default=None, repr=False)  # output id -> its place in _out_idx
    _out_idx: torch.Tensor | None = field(default=None, repr=False)
    _out_counts: torch.Tensor | None = field(default=None, repr=False)  # float32, parallel to _out_idx
    _out_new: list = field(default_factory=list, repr=False)  # output ids not in _out_idx yet

    def __post_init__(self):
        if self.generator is None:
            self.generator = torch.Generator(device="cpu")
            seed = self.params.seed
            self.generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)

    @classmethod
    def from_params(cls, params: SamplingParams, prompt: list[int], eos_ids: tuple[int, ...] = ()) -> "SamplerState":
        """``eos_ids``: the model's end-of-sequence ids (what ``min_tokens`` holds back with the stop ids)."""
        state = cls(params)
        if params.repetition_penalty != 1.0:
            state.prompt_tokens = set(prompt)
        if params.min_tokens:
            state.held_ids = tuple(sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))))
        if params.allowed_token_ids:
            state.allowed = torch.tensor(params.allowed_token_ids, dtype=torch.long)
        if params.bad_words:
            state.bad_words = BadWords(params.bad_words)
            state.recent = deque(maxlen=state.bad_words.longest_prefix)
        if params.thinking_budget is not None:
            state.thinking = ThinkingBudget(params)
        return state

    @property
    def greedy(self) -> bool:
        return self.params.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        return (self.params.presence_penalty != 0.0 or self.params.frequency_penalty != 0.0
                or self.params.repetition_penalty != 1.0)

    @property
    def _adjusts_every_row(self) -> bool:
        """Penalties, a logit bias, ``allowed_token_ids`` or ``bad_words``: settings that act on every row."""
        return (self.penalised or bool(self.params.logit_bias) or self.allowed is not None
                or self.bad_words is not None)

    @property
    def adjusted(self) -> bool:
        """The request's settings change logits at some step: those of every row, ``min_tokens``, or a
        thinking budget's forced end."""
        return self._adjusts_every_row or self.params.min_tokens > 0 or self.thinking is not None

    @property
    def holding(self) -> bool:
        """``held_ids`` are held back from the next row: fewer than ``min_tokens`` tokens are out."""
        return bool(self.held_ids) and self.produced < self.params.min_tokens

    @property
    def forced(self) -> int | None:
        """The id the thinking budget forces next; None: none."""
        return None if self.thinking is None else self.thinking.forced

    @property
    def adjusts_now(self) -> bool:
        """The next row is adjusted before it is sampled (``min_tokens`` counts only while ``holding``, a
        thinking budget only while it forces)."""
        return self._adjusts_every_row or self.holding or self.forced is not None

    def record(self, token: int) -> None:
        self.output_counts[token] = self.output_counts.get(token, 0) + 1
        if self._seen is not None and token not in self._seen:
            self._seen.add(token)
            self._seen_new.append(token)
        if self._out_pos is not None:
            pos = self._out_pos.get(token)
            if pos is not None:
                self._out_counts[pos] += 1
            elif token not in self._out_new:
                self._out_new.append(token)
        self.produced += 1
        if self.recent.maxlen:
            self.recent.append(token)
        if self.thinking is not None:
            self.thinking.record(token)

    def snapshot(self) -> dict:
        """Everything needed to resume sampling bit-exact."""
        return {
            "rng": self.generator.get_state().clone(),
            "output_counts": dict(self.output_counts),
            "produced": self.produced,
            "recent": tuple(self.recent),
            "thinking": None if self.thinking is None else self.thinking.state(),
        }

    def seen_index(self) -> torch.Tensor:
        """The prompt's and output's distinct ids (repetition_penalty), grown as new ids come out."""
        if self._seen is None:
            self._seen = set(self.prompt_tokens) | set(self.output_counts)
            self._seen_idx = torch.tensor(sorted(self._seen), dtype=torch.long)
            self._seen_new = []
        elif self._seen_new:
            self._seen_idx = torch.cat([self._seen_idx, torch.tensor(self._seen_new, dtype=torch.long)])
            self._seen_new = []
        return self._seen_idx

    def output_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the output's distinct ids, how often each came out) for presence and frequency penalties."""
        if self._out_pos is None:
            ids = list(self.output_counts)
            self._out_pos = {t: i for i, t in enumerate(ids)}
            self._out_idx = torch.tensor(ids, dtype=torch.long)
            self._out_counts = torch.tensor([float(self.output_counts[t]) for t in ids], dtype=torch.float32)
            self._out_new = []
        elif self._out_new:
            new = self._out_new
            for t in new:
                self._out_pos[t] = len(self._out_pos)
            self._out_idx = torch.cat([self._out_idx, torch.tensor(new, dtype=torch.long)])
            self._out_counts = torch.cat([self._out_counts,
                                          torch.tensor([float(self.output_counts[t]) for t in new])])
            self._out_new = []
        return self._out_idx, self._out_counts

    def restore(self, snap: dict) -> None:
        self.generator.set_state(snap["rng"])
        self._seen = self._out_pos = None  # the indexes are made again from the restored counts
        self.output_counts = dict(snap["output_counts"])
        self.produced = snap["produced"]
        self.recent = deque(snap["recent"], maxlen=self.recent.maxlen)
        if self.thinking is not None:
            self.thinking.set_state(snap["thinking"])


def _adjust(row: torch.Tensor, st: SamplerState) -> None:
    """The request's allowed ids, bad words, logit bias, penalties and ``min_tokens`` hold, in place; or
    only the thinking budget's forced id is left (at 0)."""
    forced = st.forced
    if forced is not None:
        if forced >= row.shape[-1]:
            raise ValueError(f"the thinking budget forces token {forced}, outside the vocabulary ({row.shape[-1]})")
        row.fill_(float("-inf"))
        row[forced] = 0.0
        return
    if st.allowed is not None:
        allowed = st.allowed.to(row.device)
        kept = row[allowed]
        row.fill_(float("-inf"))
        row[allowed] = kept
    if st.bad_words is not None:
        banned = [t for t in st.bad_words.banned(st.recent) if t < row.shape[-1]]  # past the row: never drawn
        if banned:
            row.index_fill_(0, torch.tensor(banned, dtype=torch.long, device=row.device), float("-inf"))
    bias = st.params.logit_bias
    if bias:
        idx = torch.tensor([t for t, _ in bias], dtype=torch.long, device=row.device)
        row.index_add_(0, idx, torch.tensor([b for _, b in bias], dtype=row.dtype, device=row.device))
    if st.penalised:
        _apply_penalties(row, st)
    if st.holding:
        row.index_fill_(0, torch.tensor(st.held_ids, dtype=torch.long, device=row.device), float("-inf"))


def _apply_penalties(row: torch.Tensor, st: SamplerState) -> None:
    rp = st.params.repetition_penalty
    if rp != 1.0:
        idx = st.seen_index().to(row.device)
        if idx.numel():
            vals = row[idx]
            row[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if st.output_counts and (st.params.presence_penalty or st.params.frequency_penalty):
        idx, counts = st.output_index()
        idx, counts = idx.to(row.device), counts.to(row.device, row.dtype)
        row[idx] -= st.params.frequency_penalty * counts + st.params.presence_penalty


def sample_row(logits: torch.Tensor, st: SamplerState, ws: SamplerWorkspace | None = None) -> int:
    """Sample one token from one row of fp32 logits [V] on the CPU; ``logits`` is left as it was."""
    adjust = st.adjusts_now
    if st.greedy and not adjust:
        return first_max(logits)
    if ws is None or ws.vocab != logits.shape[-1]:
        ws = SamplerWorkspace(logits.shape[-1])
    row = ws.row
    row.copy_(logits)
    if adjust:
        _adjust(row, st)
    if st.greedy:
        token = first_max(row)
        if row[token] == float("-inf"):
            raise NoTokenLeft()
        return token
    kept = filter_row(row, st.params, ws)
    if kept is not None and not kept.numel():
        raise NoTokenLeft()
    return draw(row, st.generator, kept, ws)


@dataclass
class TokenLogprobs:
    token_logprob: float
    top: list[tuple[int, float]]


def sample_batch(logits: torch.Tensor, states: list[SamplerState], want_logprobs: list[int | None],
                 workspace: SamplerWorkspace | None = None, failed: dict[int, Exception] | None = None
                 ) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Sample one token per row of fp32 logits [B, V] on the CPU; ``logits`` is left as it was.

    ``want_logprobs[i]`` is None (no logprobs) or the number of top
    alternatives to report for row i. ``workspace`` (of width V) is reused
    when given; otherwise one is made for this call. ``failed``: a row that
    raises is put there (row index -> exception) with placeholder token 0,
    nothing recorded, and the others are sampled as if it were not there
    (each row's draw depends only on its own state); without it, it raises.
    """
    logits = logits.float()  # no copy when already fp32
    vocab = logits.shape[-1]

    def guarded(i: int, step, *args):
        if failed is None:
            return step(*args)
        try:
            return step(*args)
        except Exception as exc:
            failed[i] = exc
            return None

    plain_greedy = all([guarded(i, _plain_greedy, st) for i, st in enumerate(states)])
    ws = workspace
    if (not plain_greedy or any(w is not None for w in want_logprobs)) and (ws is None or ws.vocab != vocab):
        ws = SamplerWorkspace(vocab)
    if plain_greedy:
        tokens = first_max_of_rows(logits)
    else:
        tokens = [None if failed and i in failed else guarded(i, sample_row, logits[i], st, ws)
                  for i, st in enumerate(states)]
    lps: list[TokenLogprobs | None] = []
    for i, (tok, st) in enumerate(zip(tokens, states)):
        k = want_logprobs[i]
        lp = None
        if tok is not None and k is not None:
            lp = guarded(i, token_logprobs, logits[i], tok, k, ws)
        if failed and i in failed:
            tokens[i], lp = 0, None
        else:
            st.record(tok)
        lps.append(lp)
    return tokens, lps


def _plain_greedy(st: SamplerState) -> bool:
    """Whether a row takes its largest logit as it is (the batch's rows then take theirs in one call)."""
    return st.greedy and not st.adjusts_now


def token_logprobs(row: torch.Tensor, token: int, top: int, ws: SamplerWorkspace) -> TokenLogprobs:
    """``token``'s log probability under the raw distribution of fp32 logits ``row`` [V] (before penalties
    and temperature), and the ``top`` most likely ids with theirs (ids at -inf left out)."""
    logp = torch.log_softmax(row, dim=-1, out=ws.probs)
    best = []
    if top > 0:
        vals, idx = torch.topk(logp, min(top, row.shape[-1]))
        best = [(t, v) for t, v in zip(idx.tolist(), vals.tolist()) if v != float("-inf")]
    return TokenLogprobs(token_logprob=float(logp[token]), top=best)
