"""A round with speculation on: the drafts, one verify forward for everything, then acceptance.

``forward`` replaces the runner's plain forward: the lanes that draft
(``engine.spec_decode``) become chunks of 1 + k positions, the other decodes
and the prefill chunks are as before, and the one forward returns the
logits of the round's sampled rows (in ``plan.sampled_ids()`` order, which
the runner samples as always: a lane's first row gives its first token) and
of every drafted position. ``finish`` runs after the runner sampled: greedy
acceptance per lane (for a seeded request the races its plain decode would
run; rejection sampling for an unseeded one, whose first token it draws
anew: ``engine.spec_sampling``), rollback of the lanes that
rejected a draft, and the rows the head takes in next round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.deltanet import RecurrenceInputs
from ignis.engine.schedule import RoundPlan
from ignis.engine.spec_decode import DraftAsk, HeadCatchUp, SpecDecoder, accepted_count
from ignis.engine.spec_sampling import processed_probs, raced, verify_raced, verify_sampled


@dataclass
class SpecRound:
    logits: torch.Tensor  # [S, vocab]: the sampled rows, in plan.sampled_ids() order
    hidden: torch.Tensor  # [T, hidden]: final-normed hidden states of every token of the forward
    first_row: dict[str, int]  # req_id -> its chunk's first row in the forward
    drafts: dict[str, list[int]]  # lanes that drafted
    verify: dict[str, torch.Tensor] = field(default_factory=dict)  # req_id -> logits of rows 1 .. k
    saved: tuple | None = None  # pre-verify state of the drafting lanes (SpecDecoder.snapshot)
    saved_lanes: list[int] = field(default_factory=list)
    takes: set[str] = field(default_factory=set)  # requests whose rows the head keeps
    record: RecurrenceInputs | None = None  # the drafting rows' recurrence inputs (for the rollback)
    sampled_row: dict[str, int] = field(default_factory=dict)  # req_id -> its row in ``logits``


def draft(spec: SpecDecoder, plan: RoundPlan, takes, samplers: dict) -> tuple[set[str], dict[str, list[int]]]:
    """The round's drafts: (the requests that take part, req_id -> its drafts). ``samplers``: req_id ->
    SamplerState. When no lane drafted and the drafter needs no rows of this round
    (``DraftVerifier.needs_rows``), the runner runs the round as a plain one (decode graphs included)."""
    taking = {d.req_id for d in plan.decodes if takes(d.req_id)} | {c.req_id for c in plan.prefills
                                                                    if takes(c.req_id)}
    asks = [DraftAsk(d.req_id, d.lane, d.position, d.token_id, d.pages, d.room,
                     None if samplers[d.req_id].greedy else samplers[d.req_id])
            for d in plan.decodes if d.req_id in taking]
    catch_ups = [HeadCatchUp(c.lane, c.start, c.token_ids[0], c.pages) for c in plan.prefills
                 if c.req_id in taking]
    return taking, spec.draft(asks, catch_ups)


def forward(spec: SpecDecoder, model, state, plan: RoundPlan, taking: set[str], drafts: dict[str, list[int]],
            device, prefill_chunks: list[SeqChunk]) -> SpecRound:
    """The one verify forward of the round, after ``draft``. ``prefill_chunks``: the runner's chunks of
    ``plan.prefills`` (images and mRoPE positions in place). A decode's positions carry its rotary offset
    (``rope_delta``: the shift a prompt's images leave)."""
    plain = [d for d in plan.decodes if not drafts.get(d.req_id)]
    drafted = [d for d in plan.decodes if drafts.get(d.req_id)]
    chunks = [SeqChunk([d.token_id], d.position, list(d.pages), d.lane, rope_offset=d.rope_delta) for d in plain]
    chunks += [SeqChunk([d.token_id, *drafts[d.req_id]], d.position, list(d.pages), d.lane,
                        rope_offset=d.rope_delta) for d in drafted]
    chunks += prefill_chunks
    first_row, row = {}, 0
    for rid, c in zip([d.req_id for d in plain] + [d.req_id for d in drafted] + [c.req_id for c in plan.prefills],
                      chunks):
        first_row[rid] = row
        row += len(c.tokens)
    sampled = [first_row[d.req_id] for d in plan.decodes]
    sampled += [first_row[c.req_id] + c.num_tokens - 1 for c in plan.prefills if c.is_last]
    verify_rows = [first_row[d.req_id] + i for d in drafted for i in range(1, 1 + len(drafts[d.req_id]))]
    batch = ForwardBatch.build(chunks, device)
    batch.logits_indices = torch.tensor(sampled + verify_rows, dtype=torch.int64, device=batch.input_ids.device)
    rnd = SpecRound(logits=None, hidden=None, first_row=first_row, drafts={d.req_id: drafts[d.req_id]
                                                                           for d in drafted}, takes=taking,
                    sampled_row={d.req_id: i for i, d in enumerate(plan.decodes)})
    if drafted:
        rnd.saved_lanes = [d.lane for d in drafted]
        rnd.saved = spec.snapshot(rnd.saved_lanes)
        # the drafting chunks follow the plain decodes, one run of rows; only those are kept
        rows = sum(1 + len(drafts[d.req_id]) for d in drafted)
        rnd.record = RecurrenceInputs(slice(len(plain), len(plain) + rows))
    logits, rnd.hidden = model.forward_hidden(batch, state, rnd.record)
    rnd.logits = logits[: len(sampled)]
    at = len(sampled)
    for d in drafted:
        k = len(drafts[d.req_id])
        rnd.verify[d.req_id] = logits[at: at + k]
        at += k
    return rnd


def target_rows(rnd: SpecRound, req_id: str, accepted: int) -> torch.Tensor:
    """The target's logits rows [1 + accepted, vocab] that decided a drafting request's tokens this round:
    its first token's row, then the verify rows of its accepted drafts' successors (a new tensor)."""
    return torch.cat([rnd.logits[rnd.sampled_row[req_id]].unsqueeze(0), rnd.verify[req_id][:accepted]])


def finish(spec: SpecDecoder, plan: RoundPlan, rnd: SpecRound, tokens: dict[str, int],
           errors: dict[str, str], samplers: dict, held=None, held_sampled=None) -> dict[str, list[int]]:
    """Acceptance, rollback and the head's next rows; -> the accepted tokens after each first token
    (a list for every lane that drafted, empty when it took none). A sampled lane that drafted gets its
    first token (``tokens``) from the rejection sampling too. ``held(req_id, first, drafts, rows)``: the
    greedy targets of a request under a grammar (``GrammarLanes.held_targets``), None for a free one;
    ``held_sampled(req_id, first, rows, drafts, q_rows, sampler)`` likewise the tokens of a sampling one
    (``GrammarLanes.held_sampled``)."""
    extra: dict[str, list[int]] = {}
    redo = []
    for d in plan.decodes:
        rid = d.req_id
        if rid not in rnd.takes:
            continue
        drafts = rnd.drafts.get(rid, [])
        st = samplers.get(rid)
        if drafts and rid not in errors and st is not None and not st.greedy:
            rows = [rnd.logits[rnd.sampled_row[rid]], *rnd.verify[rid]]
            q_rows = None if raced(st) else spec.draft_probs[rid]
            targets = held_sampled(rid, tokens[rid], rows, drafts, q_rows, st) \
                if held_sampled is not None else None
            if targets is None and q_rows is None:  # seeded: the plain sampler's races, whatever was drafted
                targets = verify_raced(tokens[rid], lambda i: rows[i].float(), drafts, st.params, spec.workspace,
                                       st.generator, spec.vocab_limit)
            elif targets is None:
                ps = [processed_probs(r.float(), st.params, spec.workspace, spec.vocab_limit) for r in rows]
                targets = verify_sampled(ps, q_rows, drafts, st.generator)
            tokens[rid] = targets[0]
            n = len(targets) - 1
        elif drafts and rid not in errors and held is not None and (
                targets := held(rid, tokens[rid], drafts, rnd.verify[rid])) is not None:
            n = min(accepted_count(drafts, targets), len(targets) - 1)  # it may stop short of the drafts
        else:
            targets = [tokens[rid]] + (spec.argmax(rnd.verify[rid]) if drafts else [])
            n = 0 if rid in errors else accepted_count(drafts, targets)
        if drafts:
            extra[rid] = targets[1: n + 1]
            if n < len(drafts):
                redo.append((SeqChunk([d.token_id, *drafts[:n]], d.position, list(d.pages), d.lane),
                             rnd.first_row[rid]))
        row = rnd.first_row[rid]
        spec.keep(d.lane, d.position, rnd.hidden[row: row + n + 1].clone(), targets[: n + 1])
    spec.rollback(rnd.saved_lanes, rnd.saved, redo, rnd.record)
    for c in plan.prefills:
        if c.req_id not in rnd.takes:
            continue
        row = rnd.first_row[c.req_id]
        after = list(c.token_ids[1:]) + ([tokens[c.req_id]] if c.is_last else [])
        spec.keep(c.lane, c.start, rnd.hidden[row: row + c.num_tokens].clone(), after)
    return extra
