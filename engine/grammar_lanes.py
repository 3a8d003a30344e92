"""Constrained streams: one grammar matcher per request, and a round's masks around the forward.

A request with a grammar gets a matcher at intake (``constrained``: at once
when its grammar is cached; else intake has it compiled off the loop first,
``engine.grammar_compiles``, and refuses one that does not compile). Invariant: a request's matcher has
consumed exactly the tokens the request has output, in order, so a request
preempted and recomputed, or evicted and resumed, continues where its grammar
was (the matcher lives here, by request id, not with the lane).

A round with constrained rows (``begin``) fills their masks before the
forward: on a worker thread while an accelerator runs the forward
(``overlap``), in place when the forward runs on the host's own cores
(there the fill's threads would only slow it); ``apply`` waits for the fill
and masks the logits; ``advance`` feeds each sampled token to its matcher. Once the
grammar is complete only the end-of-sequence tokens are allowed, so the
request ends with "stop". A matcher that fails (the library's lexer can
give up mid-output, e.g. on a regex of a million repeats) ends its request
with "error": ``advance`` names it and the round ends it, so no answer that
broke its grammar is given as complete. A round
without a constrained row touches nothing here.

A constrained request drafts under ``--speculative-tokens``. A greedy one's
first token is sampled under its mask as always, then ``held_targets`` takes
the verify rows one at a time, each masked by the matcher's state after the
tokens before it, and feeds the matcher every token the round outputs, so the
invariant above holds and the output is plain constrained decode's. A
sampling one's rows are masked the same way (``held_sampled``): a seeded one
keeps its first token and takes plain decode's race winners of the later
rows (its tokens are plain constrained decode's); an unseeded one's come from
rejection sampling (its first token taken back from the matcher and drawn
again there), so its output keeps the constrained distribution.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ignis.engine.grammar_cache import GrammarCache, GrammarError, first_line
from ignis.engine.grammar_masks import GrammarMasks
from ignis.engine.grammar_tokenizer import load_tokenizer

log = logging.getLogger("ignis.engine")


@dataclass
class RoundMasks:
    """The masks being filled for one round: which rows (positions in the round's sampled ids) and by whom."""

    rows: list[int]
    matchers: list[object]
    filled: Future


class GrammarLanes:
    def __init__(self, cache: GrammarCache, overlap: bool = False):
        self.cache = cache
        self.overlap = overlap
        self.matchers: dict[str, object] = {}
        self._masks: GrammarMasks | None = None
        self._worker: ThreadPoolExecutor | None = None

    @property
    def masks(self) -> GrammarMasks:
        if self._masks is None:
            self._masks = GrammarMasks(self.cache)
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._masks

    def constrain(self, req_id: str, grammar: str) -> str | None:
        """Give ``req_id`` a matcher for ``grammar``, compiling it here if it is not cached (tests and benches;
        the engine's intake compiles off its loop); the library's complaint when it does not compile."""
        try:
            self.matchers[req_id] = self.cache.matcher(grammar)
        except GrammarError as e:
            return str(e)
        return None

    def prepare(self) -> None:
        """Build the grammar vocabulary now (at load), not on the first grammar; a vocabulary that cannot take
        grammars is a warning here and a refusal of each grammar later, never a failed load."""
        t0 = time.perf_counter()
        try:
            self.cache.tokenizer  # built on its first read
        except GrammarError as e:
            log.warning("grammars will be refused: %s", e)
            return
        log.info("grammar vocabulary built in %.2f s", time.perf_counter() - t0)

    def constrained(self, req_id: str, grammar: str) -> bool:
        """Give ``req_id`` a matcher for ``grammar`` if it is compiled already; False if it is not."""
        matcher = self.cache.cached(grammar)
        if matcher is None:
            return False
        self.matchers[req_id] = matcher
        return True

    def release(self, req_id: str) -> None:
        self.matchers.pop(req_id, None)

    def begin(self, ids: list[str]) -> RoundMasks | None:
        """Start filling the masks of the constrained ones among a round's sampled ``ids``; None if none is."""
        if not self.matchers:
            return None
        rows = [i for i, rid in enumerate(ids) if rid in self.matchers]
        if not rows:
            return None
        matchers = [self.matchers[ids[i]] for i in rows]
        masks = self.masks
        pairs = list(zip(matchers, rows))
        if self.overlap:
            filled = self._worker.submit(masks.fill, pairs, len(ids))
        else:
            filled = Future()
            filled.set_result(masks.fill(pairs, len(ids)))
        return RoundMasks(rows, matchers, filled)

    def apply(self, logits: torch.Tensor, rnd: RoundMasks) -> None:
        """Mask the round's constrained rows of ``logits`` (fp32 [B, V], any device) in place."""
        buf = rnd.filled.result()
        with torch.inference_mode():  # the forward's output is an inference tensor
            self.masks.apply(logits, buf, rnd.rows)

    def held_targets(self, req_id: str, first: int, drafts: list[int], rows: torch.Tensor,
                     vocab_limit: int | None) -> list[int]:
        """The greedy targets ``[first, t1, ...]`` of a drafting request whose matcher has consumed ``first``:
        row i of ``rows`` (the verify rows, [k, V]) is masked by the matcher after the drafts before it and
        gives ``t(i+1)``; it stops after the first target that differs from its draft (that target is the
        round's last token). Every target past ``first`` is fed to the matcher (they are all output:
        ``engine.spec_decode.accepted_count``)."""
        matcher = self.matchers[req_id]
        targets = [first]
        if not drafts or drafts[0] != first:
            return targets
        for i in range(len(drafts)):
            if matcher.is_error() or matcher.is_stopped():
                break
            row = self._masked(matcher, rows[i], vocab_limit)
            if not torch.isfinite(row).any():
                break
            token = int(row.argmax(-1))
            if not self._feed(matcher, token):
                break
            targets.append(token)
            if i + 1 >= len(drafts) or drafts[i + 1] != token:
                break
        return targets

    def held_sampled(self, req_id: str, first: int, rows: list[torch.Tensor], drafts: list[int],
                     q_rows: list | None, params, workspace, vocab_limit: int | None,
                     generator: torch.Generator) -> list[int]:
        """The tokens of a sampling request under its grammar that drafted, where row i (``rows``: the
        round's first row, then the verify rows) is masked by the matcher after the tokens before it.
        Seeded (``q_rows`` None): ``first``, which the matcher has taken, stays, and the races of the plain
        sampler decide the rest (``spec_sampling.verify_raced``). Unseeded: rejection sampling
        (``engine.spec_sampling``); ``first`` is taken back from the matcher and drawn again. Every token
        output is fed to the matcher; one it refuses though its mask allowed it (logged) ends the output
        before it."""
        from ignis.engine.spec_sampling import processed_probs, verify_raced, verify_sampled

        matcher = self.matchers[req_id]
        if q_rows is not None:
            matcher.rollback(1)
        fed = [1 if q_rows is None else 0]  # output tokens of this step the matcher has taken

        def masked_row(i: int):  # tokens before i equal their drafts: the matcher takes them, then masks row i
            if i > fed[0]:
                if not self._feed(matcher, drafts[i - 1]):
                    return None
                fed[0] = i
            if matcher.is_error() or matcher.is_stopped():
                return None
            row = self._masked(matcher, rows[i], vocab_limit)
            return row[0] if torch.isfinite(row).any() else None

        if q_rows is None:
            out = verify_raced(first, masked_row, drafts, params, workspace, generator, vocab_limit)
        else:
            def p_at(i: int):
                row = masked_row(i)
                return None if row is None else processed_probs(row, params, workspace, vocab_limit)

            out = verify_sampled(p_at, q_rows, drafts, generator) or [first]  # nothing to draw from: it stays
        for n in range(fed[0], len(out)):
            if not self._feed(matcher, out[n]):  # its mask allowed it: logged; the output stops before it
                if n == 0:  # a redrawn first token: the one the matcher took before stays
                    self._feed(matcher, first)
                    return [first]
                return out[:n]
        return out

    def _masked(self, matcher, row: torch.Tensor, vocab_limit: int | None) -> torch.Tensor:
        """``row`` ([V]) as a new fp32 [1, V] row masked by ``matcher``'s state (and past ``vocab_limit``)."""
        buf = self.masks.fill([(matcher, 0)], 1)
        out = row.reshape(1, -1).float().clone()
        if vocab_limit is not None and vocab_limit < out.shape[-1]:
            out[:, vocab_limit:] = float("-inf")
        self.masks.apply(out, buf, [0])
        return out

    @staticmethod
    def _feed(matcher, token: int) -> bool:
        if matcher.consume_token(token):
            return True
        log.warning("grammar matcher failed on token %d: %s", token, first_line(matcher.get_error()))
        return False

    def advance(self, rnd: RoundMasks, tokens: list[int]) -> dict[int, str]:
        """Feed each constrained row's sampled token to its matcher; returns {row: error} for the rows whose
        matcher failed (its lexer gave up mid-output, or it refused the token): those requests end with an
        error, not with an answer the grammar no longer holds."""
        pairs = [(m, tokens[i]) for m, i in zip(rnd.matchers, rnd.rows)]
        failed = {}
        for (m, tok), ok, row in zip(pairs, self.masks.executor.consume_token_par(pairs), rnd.rows):
            if not ok or m.is_error():
                error = first_line(m.get_error())
                log.warning("grammar matcher failed on token %d: %s", tok, error)
                failed[row] = f"the grammar failed: {error}"
        return failed


def grammar_lanes(model_dir, vocab: int, eos_ids, device: str) -> GrammarLanes:
    """The grammar lanes of one checkpoint loaded on ``device``; its grammar tokenizer is built on the first grammar."""
    return GrammarLanes(GrammarCache(lambda: load_tokenizer(model_dir, vocab, tuple(eos_ids))),
                        overlap=torch.device(device).type != "cpu")
