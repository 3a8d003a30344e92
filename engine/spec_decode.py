"""Speculative decoding with the multi-token-prediction head: drafts, their verification, and rollback.

``DraftVerifier`` holds what any drafter shares (the rollback, greedy targets,
the sampler workspace); ``SpecDecoder`` is the head's drafter and prompt
lookup's is ``engine.ngram_drafter.NgramDrafter``.

A speculative round (``engine.spec_round``) calls three things when
speculation is on (``--speculative-tokens K``):

1. ``draft``: before the target's forward. The head first takes in the rows
   it has not seen (``Pending``: the target's final-normed hidden states of
   the positions the last round computed, and the token after each), which
   fills its KV at those positions with what a plain decode would have left
   there; the last row's output gives the first draft. Each further draft
   step feeds one row per lane (the previous draft, the head's own output as
   the hidden state). A lane drafts at most its decode's ``room`` tokens.
2. The target verifies every lane's ``[token, d1 .. dk]`` in one batched
   forward (each lane a chunk of k+1 positions), logits at every position.
   ``accepted_count``: greedy acceptance takes drafts while they equal the target's
   argmax; the output is the accepted drafts and the target's own token after
   them, exactly what plain greedy decode yields.
3. ``rollback``: the lane's recurrent state (delta-rule and conv) went over
   all k+1 inputs. A lane that rejected a draft gets its pre-verify state back
   (``snapshot``, taken just before the forward) and re-advances over its
   accepted inputs only, so its state equals a plain decode's. Only the conv
   and delta rule of the linear-attention layers run again, on the recurrence
   inputs they had in the verify forward (``RecurrenceInputs``, kept for the
   drafting rows; ``HybridModel.advance_linear``): causal, so the same. The KV of the
   rejected positions is overwritten when those positions are computed again;
   the scheduler gives their whole pages back (``SequencePages.shrink_to``).

Only requests without sampling adjustments (penalties, logit bias, allowed
ids, bad words, ``min_tokens``, a thinking budget), without an adapter, and
not asking logprobs under a grammar draft (``ModelRunner.undrafted`` names
why one does not); the others step as before in the same forward.
A drafting request's logprobs come from the verify forward's rows.
A greedy request's drafts are the head's argmax; a seeded one's are the
races of the head's rows under the keys its next tokens will be drawn with,
verified by the target's races under those keys; an unseeded one's are
drawn from the head's distribution under its own sampling settings, kept in
``draft_probs`` for the rejection sampling that verifies them
(``engine.spec_sampling``).

The head's KV is a page tensor of its own, ``[layers, 2, pages, 64, Hkv, D]``,
indexed by the target's page ids: a lane's head KV lives in the pages its
request holds. It is not part of retained images or tier moves: a request
that resumes from a retained entry starts its head rows at the resume point,
and drafts attending to head KV of an earlier holder of a page may be worse
(fewer accepted), never wrong: verification alone decides the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.deltanet import RecurrenceInputs
from ignis.engine.models.state import ModelState
from ignis.engine.page_pool import PAGE_TOKENS
from ignis.engine.sampling_steps import SamplerWorkspace, peek_race_keys
from ignis.engine.spec_sampling import draw_from, processed_probs, race_row, raced


@dataclass
class Pending:
    """Rows a lane's head has not taken in: positions ``start .. start+m-1``.

    ``hidden`` [m, h]: the target's final-normed hidden states of those positions;
    ``tokens``: the token after each position, as far as known (m, or m - 1 while the next
    token is not known yet: a prefill chunk that does not end its prompt)."""

    start: int
    hidden: torch.Tensor
    tokens: list[int]

    @property
    def end(self) -> int:
        return self.start + int(self.hidden.shape[0])


@dataclass(frozen=True)
class DraftAsk:
    """One lane that may draft this round: its decode's position, input token, pages and room."""

    req_id: str
    lane: int
    position: int
    token_id: int
    pages: tuple[int, ...]
    room: int
    sampler: object = None  # the request's SamplerState when it samples; None: greedy


@dataclass(frozen=True)
class HeadCatchUp:
    """A prefill lane's pending rows, now that the chunk starting at ``start`` gives their last token."""

    lane: int
    start: int
    first_token: int
    pages: tuple[int, ...]


def accepted_count(drafts: list[int], targets: list[int]) -> int:
    """Greedy acceptance: leading drafts equal to the target's token at the same row."""
    n = 0
    for d, t in zip(drafts, targets):
        if d != t:
            break
        n += 1
    return n


class DraftVerifier:
    """What every drafter shares: the verified window's rollback, greedy targets, the sampler workspace.

    A drafter (``SpecDecoder``, ``engine.ngram_drafter.NgramDrafter``) also answers ``begin`` and
    ``forget`` (a lane starts over), ``keep`` (the tokens and rows a round computed) and ``draft``."""

    needs_rows = False  # whether it takes in every round's rows (else a round where no lane drafted is plain)

    def __init__(self, model, state: ModelState, k: int, vocab_limit: int | None = None):
        if k < 1:
            raise ValueError(f"--speculative-tokens must be >= 1 to speculate, got {k}")
        if state.kv_format != "bf16":
            raise ValueError("--speculative-tokens needs --kv-format bf16 (an hq-e8-2b exact window cannot be "
                             "rolled back)")
        self.model, self.state, self.k = model, state, k
        self.vocab_limit = vocab_limit
        self.workspace = SamplerWorkspace(model.cfg.vocab_size)
        self.draft_probs: dict[str, list] = {}  # this round's sampled drafts: q of each (None: a point mass)
        self.disable_at: int | None = None  # decoding lanes from which a round does not speculate
        # the snapshot's memory, made at the first snapshot and kept (the memory plan sets it aside): a clone
        # per round would ask the allocator for every drafting lane's state again, gigabytes on a 27B
        self._saved: tuple[torch.Tensor, torch.Tensor] | None = None

    def begin(self, lane: int, tokens: tuple[int, ...]) -> None:
        """A request takes ``lane``: ``tokens``, its prompt and any output so far."""
        self.forget(lane)

    def follow(self, decodes) -> None:
        """A round that drafts nothing: each decode's input token (``DecodeItem``s). The head needs nothing
        (it takes in rows again from its next round); prompt lookup keeps its lanes' tokens whole."""

    def on_for(self, decodes: int) -> bool:
        """Whether a round of ``decodes`` decoding lanes speculates (``--speculative-disable-by-batch-size``:
        from that many on, a round is compute-bound enough that verify rows cost what they save)."""
        return self.disable_at is None or decodes < self.disable_at

    def argmax(self, logits: torch.Tensor) -> list[int]:
        """Greedy tokens of logits rows (ids past the tokenizer's vocabulary never win)."""
        if self.vocab_limit is not None and self.vocab_limit < logits.shape[-1]:
            logits = logits[:, : self.vocab_limit]
        return logits.argmax(-1).tolist()

    # ----- verification and rollback --------------------------------------------------
    def snapshot(self, lanes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrent and conv state of ``lanes`` before the verify forward, copied into memory made
        at start (valid until the next snapshot)."""
        ssm, conv = self.state.ssm, self.state.conv
        if self._saved is None:
            self._saved = (torch.empty(ssm.numel(), dtype=ssm.dtype, device=ssm.device),
                           torch.empty(conv.numel(), dtype=conv.dtype, device=conv.device))
        idx = torch.tensor(lanes, device=ssm.device)
        out = []
        for live, flat in zip((ssm, conv), self._saved):
            shape = (live.shape[0], len(lanes), *live.shape[2:])
            out.append(torch.index_select(live, 1, idx, out=flat[:math.prod(shape)].view(shape)))
        return out[0], out[1]

    def rollback(self, lanes: list[int], saved: tuple[torch.Tensor, torch.Tensor],
                 redo: list[tuple[SeqChunk, int]], record: RecurrenceInputs) -> None:
        """Put the lanes of ``redo`` back to their pre-verify state (``saved``: the snapshot of
        ``lanes``), then advance them over their accepted inputs: ``redo`` holds one chunk per lane and
        its first row in the verify forward, whose recurrence inputs (``record``) go through the conv
        and the delta rule again; projections, attention, MLPs and the head do not run."""
        if not redo:
            return
        dev = self.state.ssm.device
        chunks = [c for c, _ in redo]
        ssm, conv = saved
        rows = torch.tensor([r + i for c, r in redo for i in range(len(c.tokens))], device=dev)
        with torch.inference_mode():
            for c in chunks:  # lane by lane: a gather of the rejecting lanes would be one more copy of them
                j = lanes.index(c.slot)
                self.state.ssm[:, c.slot].copy_(ssm[:, j])
                self.state.conv[:, c.slot].copy_(conv[:, j])
            self.model.advance_linear(ForwardBatch.build(chunks, dev), self.state, record.pick(rows))


class SpecDecoder(DraftVerifier):
    """The multi-token-prediction drafter: its device state (its KV, each lane's pending rows) and drafting.

    A head of several layers runs layer ``s % layers`` at draft step s (released heads have one); the
    rows the head takes in go through layer 0 only, so a further layer attends to its own draft rows."""

    needs_rows = True  # the head takes in the hidden rows of every position the target computes

    def __init__(self, model, head, state: ModelState, k: int, vocab_limit: int | None = None):
        super().__init__(model, state, k, vocab_limit)
        self.head = head
        pages = state.pages
        cfg = model.cfg
        self.kv = torch.zeros((head.num_layers, 2, pages.shape[2], PAGE_TOKENS, cfg.num_kv_heads, cfg.head_dim),
                              dtype=pages.dtype, device=pages.device)
        self.pending: dict[int, Pending] = {}
        self._keys: dict[str, list[int]] = {}  # this round's seeded asks: the keys of their next tokens' races

    # ----- lanes -------------------------------------------------------------------
    def forget(self, lane: int) -> None:
        """The lane starts over (a new request, a resume, a preemption): its rows are dropped."""
        self.pending.pop(lane, None)

    def keep(self, lane: int, start: int, hidden: torch.Tensor, tokens: list[int]) -> None:
        """Rows of positions ``start ..`` the last forward computed, for the head's next pass."""
        self.pending[lane] = Pending(start, hidden, list(tokens))

    # ----- drafting ------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor, asks: list[DraftAsk], step: int) -> list[int]:
        """Draft ``step`` of each ask from the head's logits rows: argmax; for a seeded request the race
        under the key its token at that position will be drawn with (``spec_sampling.verify_raced``);
        for an unseeded one a draw under its settings, its distribution kept for the rejection sampling."""
        greedy = [a.sampler is None for a in asks]
        best = self.argmax(logits) if any(greedy) else [0] * len(asks)
        out = []
        for i, a in enumerate(asks):
            if greedy[i]:
                out.append(best[i])
                continue
            if raced(a.sampler):
                keys = self._keys.get(a.req_id)
                if keys is None:
                    keys = self._keys[a.req_id] = peek_race_keys(a.sampler.generator, a.room)
                out.append(race_row(logits[i].float(), a.sampler.params, self.workspace, keys[step],
                                    self.vocab_limit))
                continue
            q = processed_probs(logits[i].float(), a.sampler.params, self.workspace, self.vocab_limit)
            self.draft_probs.setdefault(a.req_id, []).append(q)
            out.append(draw_from(q, a.sampler.generator))
        return out

    @torch.inference_mode()
    def draft(self, asks: list[DraftAsk], catch_ups: list[HeadCatchUp]) -> dict[str, list[int]]:
        """The head's pass over every lane's pending rows, then up to ``room`` drafts per ask.

        An ask whose lane has no rows ending just before its position (a resumed request's
        first step) drafts nothing this round; its rows start with this round's forward."""
        chunks, hidden, drafting = [], [], []
        self.draft_probs = {}
        self._keys = {}
        for c in catch_ups:
            p = self.pending.pop(c.lane, None)
            if p is None or p.end != c.start or len(p.tokens) != p.end - p.start - 1:
                continue
            chunks.append(SeqChunk(p.tokens + [c.first_token], p.start, list(c.pages), c.lane, sampled=False))
            hidden.append(p.hidden)
        for a in asks:
            p = self.pending.pop(a.lane, None)
            if p is None or p.end != a.position or len(p.tokens) < p.end - p.start - 1:
                continue
            tokens = p.tokens[: p.end - p.start - 1] + [a.token_id]
            chunks.append(SeqChunk(tokens, p.start, list(a.pages), a.lane))
            hidden.append(p.hidden)
            if a.room:
                drafting.append(a)
        if not chunks:
            return {}
        dev = self.state.pages.device
        batch = ForwardBatch.build(chunks, dev)
        out = self.head(self.model, batch, torch.cat(hidden), self.kv[0], step=0)
        if not drafting:
            return {}
        # the sampled rows are the asks' last rows, in chunk order: the drafting asks among them
        last = out[batch.logits_indices]
        sampled_lanes = [c.slot for c in chunks if c.sampled]
        rows = [sampled_lanes.index(a.lane) for a in drafting]
        out_rows = last[rows]
        drafts = {a.req_id: [t] for a, t in zip(drafting, self._pick(self.head.logits(self.model, out_rows),
                                                                         drafting, 0))}
        for step in range(1, max(a.room for a in drafting)):
            going = [(i, a) for i, a in enumerate(drafting) if a.room > step]
            if not going:
                break
            batch = ForwardBatch.build([SeqChunk([drafts[a.req_id][-1]], a.position + step - 1, list(a.pages),
                                                 a.lane) for _, a in going], dev)
            step_out = self.head(self.model, batch, out_rows[[i for i, _ in going]],
                                 self.kv[step % self.head.num_layers], step=step)
            for (i, a), t in zip(going, self._pick(self.head.logits(self.model, step_out), [a for _, a in going],
                                                   step)):
                drafts[a.req_id].append(t)
            out_rows = out_rows.clone()
            out_rows[[i for i, _ in going]] = step_out
        return drafts
