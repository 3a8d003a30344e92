"""The model runner: turns a :class:`RoundPlan` into one forward and one sampled token per stream.

It owns the device side of live sequences (the :class:`ModelState`) and each
request's :class:`SamplerState`. The scheduler owns which lane and pages a
request has; the runner trusts the plan, resets a lane's recurrent state when
a request starts on it, and keeps sampler states across preemptions so a
resumed request draws exactly as it would have.

Logits exist only for the rows sampled this round: one per decode and one
per prefill that ends its prompt, at most one per lane. The forward returns
exactly those rows, in ``plan.sampled_ids()`` order; they are copied to the
host once (and widened to fp32 where the model is not), and the sampler
works on them in one :class:`SamplerWorkspace` kept for the runner's life.

Constrained rows (requests with a grammar, ``grammar_lanes.py``): their masks
are filled while the forward runs and applied to their logits on the device
before the copy to the host, so every sampling setting, and the logprobs,
see only the tokens the grammar allows. A round without one pays nothing.

A request whose sampling fails ends alone (``engine.row_sampling``).

A request that scores its prompt (``prompt_logprobs``) has the rows of its
prefill chunks put through the head too, a slice at a time, and reduced to
its prompt tokens' logprobs (``engine.prompt_scores``); ``RoundResult.prompt_logprobs``
carries them.

On CUDA a round of decode steps only replays a captured graph
(``engine.decode_graphs``) instead of launching the forward op by op.

With a drafter (``use_drafter``, ``--speculative-tokens``), a round where a
request that can speculate (no penalties, logit bias, allowed ids, bad words, min_tokens or thinking
budget; a grammar only without logprobs) takes part runs through ``engine.spec_round``: drafts, one verify forward, then acceptance
after the usual sampling; ``RoundResult.extra`` carries the accepted tokens,
and a request that asked for logprobs gets one per token of the round, each
from the verify forward's row that decided it (what plain decode computes
at that position).
"""

from __future__ import annotations

import logging

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.grammar_lanes import GrammarLanes
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.engine.row_sampling import sample_isolated
from ignis.engine.sampling import SamplerState, SamplerWorkspace, TokenLogprobs, token_logprobs
from ignis.engine import spec_round
from ignis.engine.image_encoder import ImageEncoder
from ignis.engine.prompt_scores import PromptScoring
from ignis.engine.schedule import PrefillChunk, RoundPlan, RoundResult

log = logging.getLogger("ignis.engine")

DEFAULT_IMAGE_CACHE_BYTES = 256 << 20


class ModelRunner:
    def __init__(self, model: HybridModel, state: ModelState, device: str = "cpu", vocab_limit: int | None = None,
                 grammars: GrammarLanes | None = None, image_cache_bytes: int = DEFAULT_IMAGE_CACHE_BYTES):
        self.model = model
        # None: the model takes no images
        self.images = ImageEncoder(model.vision, image_cache_bytes) if model.vision is not None else None
        self.grammars = grammars  # None: this model takes no grammars
        self.eos_token_ids = tuple(model.cfg.eos_token_ids)  # what min_tokens holds back (the scheduler's ends)
        self.state = state
        self.device = torch.device(device)
        self.samplers: dict[str, SamplerState] = {}
        self.want_logprobs: dict[str, int | None] = {}
        # ids at or past vocab_limit (embedding rows padding the tokenizer) are never sampled
        self.vocab_limit = vocab_limit
        self.workspace = SamplerWorkspace(model.cfg.vocab_size)
        self.scoring = PromptScoring(model.cfg.vocab_size, vocab_limit)
        self.last_logits: dict = {}  # req_id -> the row it was sampled from this round (views, no copy)
        self.graphs = None  # DecodeGraphs once captured (CUDA)
        # rounds of plain greedy rows (no penalties, no logprobs) take their argmax where the logits are and
        # copy only the tokens to the host: on CUDA that spares a [rows, vocab] copy per round
        self.greedy_on_device = self.device.type != "cpu"
        self.spec = None  # a SpecDecoder once a drafter is in use
        self._adapted: set[str] = set()  # requests running with an adapter: they do not draft

    @property
    def lora(self):
        """The LoRA adapters served with the model (``engine.models.lora.LoraSet``; None: none), as the
        model holds them: adapters attached while serving are seen at once."""
        return getattr(self.model, "lora", None)

    def use_drafter(self, spec) -> None:
        """Speculate with ``spec`` (an ``engine.spec_decode.DraftVerifier``: the multi-token-prediction head's
        ``SpecDecoder`` or prompt lookup's ``engine.ngram_drafter.NgramDrafter``) from the next round on."""
        self.spec = spec

    def speculates(self, req_id: str) -> bool:
        """``req_id`` drafts when a drafter is in use: its logits unadjusted (a sampled request's drafts are
        verified by plain decode's races when seeded, else by rejection sampling: ``engine.spec_sampling``);
        under a grammar only one that asks for no logprobs (its verify rows are masked one by one:
        ``GrammarLanes.held_targets``, ``held_sampled``)."""
        return self.spec is not None and req_id in self.samplers and self.undrafted(req_id) is None

    def undrafted(self, req_id: str) -> str | None:
        """Why ``req_id`` never drafts though a drafter is in use (None: it drafts, or there is no drafter):
        ``adapter`` (a LoRA adapter), ``sampling_adjustments`` (penalties, a logit bias, allowed ids, bad
        words, ``min_tokens``, a thinking budget), ``grammar_logprobs`` (logprobs under a grammar)."""
        st = self.samplers.get(req_id)
        if self.spec is None or st is None:
            return None
        if req_id in self._adapted:
            return "adapter"
        if st.adjusted:
            return "sampling_adjustments"
        if (self.grammars is not None and req_id in self.grammars.matchers
                and self.want_logprobs.get(req_id) is not None):
            return "grammar_logprobs"
        return None

    def _held_targets(self, req_id: str, first: int, drafts: list[int], rows) -> list[int] | None:
        """A drafting request's greedy targets under its grammar; None when it has none."""
        if self.grammars is None or req_id not in self.grammars.matchers:
            return None
        return self.grammars.held_targets(req_id, first, drafts, rows, self.vocab_limit)

    def _held_sampled(self, req_id: str, first: int, rows, drafts: list[int], q_rows, st) -> list[int] | None:
        """A drafting sampling request's tokens under its grammar; None when it has none."""
        if self.grammars is None or req_id not in self.grammars.matchers:
            return None
        return self.grammars.held_sampled(req_id, first, rows, drafts, q_rows, st.params, self.spec.workspace,
                                          self.vocab_limit, st.generator)

    def warm_up(self) -> None:
        """Compile every kernel variant a round can meet before the first request does.

        Triton specialises integer arguments (1, multiples of 16, others) and
        pointers (16-byte aligned or not); the kernels leave unspecialised what
        changes from round to round (batch counts, the page table's width, the
        split scratch's strides, slices at a mixed batch's offset), and the
        warm-up runs prefills of odd and whole-tile lengths, a decode step, and
        a mixed batch (decodes and a prefill chunk in one forward), on lanes 0
        and 1 and the first pages, and clears them after. A varied workload then
        meets no variant the warm-up did not compile
        (tests/kernels/test_kernel_variants.py)."""
        lanes = [0, 1] if self.state.lanes > 1 else [0, 0]
        pages = list(range(min(2, self.state.num_pages)))
        tile = 64 if len(pages) * 64 >= 67 else 16
        rounds = [
            [SeqChunk([0, 0, 0], 0, pages, lanes[0])],
            [SeqChunk([0], 3, pages, lanes[0])],
            [SeqChunk([0] * tile, 0, pages, lanes[1])] if lanes[1] != lanes[0] else [],
            [SeqChunk([0], 4, pages, lanes[0]), SeqChunk([0, 0, 0], tile, pages, lanes[1])]
            if lanes[1] != lanes[0] else [],
        ]
        for lane in set(lanes):
            self.state.reset_lane(lane)
        for chunks in rounds:
            if chunks:
                self.model(ForwardBatch.build(chunks, self.device), self.state)
        for lane in set(lanes):
            self.state.reset_lane(lane)

    def use_graphs(self, graphs) -> None:
        """Replay ``graphs`` (a captured ``DecodeGraphs``) for the decode-only rounds it takes."""
        self.graphs = graphs

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        self.state.close()

    def release(self, req_id: str) -> None:
        """Forget a finished request's sampler."""
        self.samplers.pop(req_id, None)
        self.want_logprobs.pop(req_id, None)
        self.scoring.release(req_id)
        self._adapted.discard(req_id)
        if self.images is not None:
            self.images.release(req_id)
        if self.grammars is not None:
            self.grammars.release(req_id)

    def _start(self, plan: RoundPlan) -> None:
        for ev in plan.finished:
            self.release(ev.req_id)
        self._capture(plan, before_round=True)  # an aborted prefill's lane may be reset or loaded below
        for src, dst in plan.copies_before:
            self.state.copy_page(src, dst)
        if self.spec is not None:
            for p in plan.preempted:
                self.spec.forget(p.lane)
            for s in plan.started:
                self.spec.begin(s.lane, s.prompt_ids + s.generated)
        for s in plan.started:
            if self.lora is not None:
                self.lora.assign(s.lane, s.adapter)
                if s.adapter >= 0:
                    self._adapted.add(s.req_id)
            if s.restore_slot is None:
                self.state.reset_lane(s.lane)
            else:
                self.state.load_image(s.restore_slot, s.lane)
            if s.req_id not in self.samplers or not s.generated:
                try:
                    self.samplers[s.req_id] = SamplerState.from_params(s.sampling, list(s.prompt_ids),
                                                                       self.eos_token_ids)
                except Exception:  # its rows fail alone when sampled (engine.row_sampling)
                    log.exception("request %s: its sampler could not be set up", s.req_id)
                    self.samplers.pop(s.req_id, None)
                self.want_logprobs[s.req_id] = s.sampling.top_logprobs if s.sampling.logprobs else None
            self.scoring.start(s.req_id, s.prompt_ids, s.sampling.prompt_logprobs)

    def _capture(self, plan: RoundPlan, before_round: bool = False) -> None:
        """After the forward: fill this round's new retained entries (pages, then images: those of marks
        inside a chunk the forward kept as it passed them). ``before_round``: the orders made before
        anything else in the round instead."""
        for order in plan.captures:
            if order.before_round != before_round:
                continue
            for src, dst in order.page_copies:
                self.state.copy_page(src, dst)
            if not order.kept_in_forward:
                self.state.save_image(order.lane, order.slot)

    def _prefill_chunks(self, prefills: list[PrefillChunk]) -> list[SeqChunk]:
        """The round's prefill chunks; those touching images get their embeddings and mRoPE positions
        (the images are encoded first, all in one tower call)."""
        wanted = [(c.req_id, c.layout, i) for c in prefills if c.layout is not None
                  for i, _ in c.layout.overlapping(c.start, c.end)]
        if wanted and self.images is None:
            raise ValueError("a prefill chunk holds images, but this model has no vision tower")
        if wanted:
            self.images.prepare(wanted)
        out = []
        for c in prefills:
            layout = c.layout
            if layout is None:
                out.append(SeqChunk(list(c.token_ids), c.start, list(c.pages), c.lane, sampled=c.is_last,
                                    keeps=c.keeps))
                continue
            embeds = []
            for i, span in layout.overlapping(c.start, c.end):
                a, b = max(c.start, span.start), min(c.end, span.end)
                embeds.append((a - c.start, self.images.embedding(c.req_id, i)[a - span.start:b - span.start]))
                if b == span.end:
                    self.images.done(c.req_id, i)
            out.append(SeqChunk(list(c.token_ids), c.start, list(c.pages), c.lane, sampled=c.is_last,
                                rope_offset=layout.delta_at(c.start), mrope=layout.positions(c.start, c.end),
                                embeds=tuple(embeds), keeps=c.keeps))
        return out

    def run(self, plan: RoundPlan) -> tuple[RoundResult, dict[str, TokenLogprobs | list[TokenLogprobs]]]:
        """Run one round; returns the sampled tokens and, where asked, their logprobs (a list, one per
        token, for a request that drafted)."""
        self._start(plan)
        self.last_logits = {}
        if not plan.computes:
            return RoundResult(), {}
        chunks = [SeqChunk([d.token_id], d.position, list(d.pages), d.lane, rope_offset=d.rope_delta)
                  for d in plan.decodes]
        chunks += self._prefill_chunks(plan.prefills)
        ids = plan.sampled_ids()
        masks = self.grammars.begin(ids) if self.grammars is not None else None  # filled during the forward
        spec = hidden = None
        scored = [c for c in plan.prefills if self.scoring.wants(c.req_id)]
        taking, drafts = set(), {}
        if self.spec is not None and self.spec.on_for(len(plan.decodes)) and any(
                self.speculates(r) for r in [d.req_id for d in plan.decodes] + [c.req_id for c in plan.prefills]):
            taking, drafts = spec_round.draft(self.spec, plan, self.speculates, self.samplers)
        elif self.spec is not None:
            self.spec.follow(plan.decodes)  # a round it does not draft in: the tokens go in all the same
        if drafts or (taking and self.spec.needs_rows):
            spec = spec_round.forward(self.spec, self.model, self.state, plan, taking, drafts, self.device,
                                      chunks[len(plan.decodes):])
            logits, hidden = spec.logits, spec.hidden
        elif (not plan.prefills and self.graphs is not None and self.graphs.takes(chunks)
              and not (self.lora is not None and self.lora.takes(c.slot for c in chunks))):
            logits = self.graphs.run(chunks)
        elif scored:  # the final-normed rows of every token too, for the prompt scores
            logits, hidden = self.model.forward_hidden(ForwardBatch.build(chunks, self.device), self.state)
        else:  # one row per sampled id, in sampled_ids() order
            logits = self.model(ForwardBatch.build(chunks, self.device), self.state)
        self._capture(plan)
        prompt_logprobs = self._score(plan, scored, chunks, hidden, spec) if scored else {}
        if not ids:
            if spec is not None:
                spec_round.finish(self.spec, plan, spec, {}, {}, self.samplers)
            return RoundResult(prompt_logprobs=prompt_logprobs), {}
        picked = logits.float()  # the forward's own tensor when the model is fp32
        if self.vocab_limit is not None and self.vocab_limit < picked.shape[-1]:
            with torch.inference_mode():  # the forward's output is an inference tensor: written in the mode only
                picked[:, self.vocab_limit:] = float("-inf")
        if masks is not None:
            self.grammars.apply(picked, masks)
        states = [self.samplers.get(i) for i in ids]
        # a request that drafted gets every logprob of its round from the verify rows (``_spec_logprobs``)
        drafted = spec.drafts if spec is not None else {}
        wants = [None if i in drafted else self.want_logprobs.get(i) for i in ids]
        if self.greedy_on_device and all(w is None for w in wants) and all(
                st is not None and st.greedy and not st.adjusts_now for st in states):
            tokens = picked.argmax(-1).tolist()  # the first largest entry, as the host sampler picks it
            for st, token in zip(states, tokens):
                st.record(token)
            lps, errors, invalid = [None] * len(ids), {}, set()
            self.last_logits = dict(zip(ids, picked))
        else:
            picked = picked.cpu()
            self.last_logits = dict(zip(ids, picked))  # for tests and diagnostics; the sampler never writes them
            invalid: set[str] = set()
            tokens, lps, errors = sample_isolated(picked, ids, states, wants, self.workspace, invalid)
        if masks is not None:
            # a failed row's placeholder too: that request ends now; a matcher that fails ends its request
            for row, error in self.grammars.advance(masks, tokens).items():
                errors.setdefault(ids[row], error)
        result = RoundResult(tokens=dict(zip(ids, tokens)), errors=errors, invalid=invalid,
                             prompt_logprobs=prompt_logprobs)
        if spec is not None:
            result.extra = spec_round.finish(self.spec, plan, spec, result.tokens, errors, self.samplers,
                                             self._held_targets, self._held_sampled)
            result.drafted = {rid: len(d) for rid, d in spec.drafts.items()}
            for rid, more in result.extra.items():
                for token in more:
                    self.samplers[rid].record(token)
        logprobs = {i: lp for i, lp in zip(ids, lps) if lp is not None}
        if spec is not None:
            logprobs.update(self._spec_logprobs(spec, result))
        return result, logprobs

    def _score(self, plan: RoundPlan, scored: list[PrefillChunk], chunks: list[SeqChunk], hidden: torch.Tensor,
               spec) -> dict[str, list]:
        """The prompt scores of this round's ``scored`` prefill chunks, from the forward's final-normed rows
        ``hidden`` (batch order: the decodes' rows, then each prefill chunk's; a speculative round says
        where each request's rows start)."""
        if spec is not None:
            first_row = spec.first_row
        else:
            first_row, row = {}, sum(len(c.tokens) for c in chunks[:len(plan.decodes)])
            for c in plan.prefills:
                first_row[c.req_id] = row
                row += c.num_tokens
        weight = self.model.head_weight()

        def head(rows: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(rows, weight)

        out = {}
        for c in scored:
            at = first_row[c.req_id]
            found = self.scoring.score(c.req_id, c.start, c.end, hidden[at:at + c.num_tokens], head)
            if found:
                out[c.req_id] = found
        return out

    def _spec_logprobs(self, spec, result: RoundResult) -> dict[str, list[TokenLogprobs]]:
        """Per drafting request that asked for logprobs: one per token of its round (the first may have
        been drawn again by an unseeded request's rejection sampling), from the rows of the verify forward."""
        out = {}
        for rid, more in result.extra.items():
            top = self.want_logprobs.get(rid)
            if top is None or rid in result.errors:
                continue
            tokens = (result.tokens[rid], *more)
            with torch.inference_mode():
                rows = spec_round.target_rows(spec, rid, len(more)).float().cpu()
                if self.vocab_limit is not None and self.vocab_limit < rows.shape[-1]:
                    rows[:, self.vocab_limit:] = float("-inf")
                out[rid] = [token_logprobs(row, t, top, self.workspace) for row, t in zip(rows, tokens)]
        return out
