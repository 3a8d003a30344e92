"""One choice of a completion: engine tokens in, text deltas, tool calls and token records out.

Pipeline per token, in stream order::

    token id ──> IncrementalDetokenizer ──> StopMatcher ──> OutputParser ──> ChoiceDelta
       └── token_ids / logprobs recorded up to the token that completed a stop string

The stop token of a user's ``stop_token_ids`` is kept in ``token_ids`` but its
text is not rendered unless ``include_stop`` (like vLLM). A matched stop
string is left out of the text unless ``include_stop`` (vLLM's
``include_stop_str_in_output``) keeps it at the end. With ``min_tokens``, stop strings are looked
for only in the text of the tokens after the first ``min_tokens`` (the engine
holds back stop ids and end-of-sequence until then). Synchronous and pure:
the HTTP layer feeds it ``StreamTokens`` and sends what comes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.gateway.detokenize import IncrementalDetokenizer
from ignis.gateway.output_parser import OutputParser, ToolCallDelta
from ignis.gateway.stop_strings import StopMatcher
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.wire import PromptLogprobs, StreamTokens, TokenLogprobs


@dataclass(frozen=True)
class TokenRecord:
    """A chosen token with its log probability and the top alternatives ``((id, logprob), ...)``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    kind: str | None = None
    """With a parser, what the token's text became: "reasoning", "content" or "tool_call" (the first the
    parser gave out when it took the token), None when it gave out nothing yet (text held back, a marker)."""


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice produced since the last delta."""

    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    """Pieces of calls in stream order: a call's first piece names it, the rest add argument text."""
    pieces: list[tuple[str, object]] = field(default_factory=list)
    """With a parser: the same text and calls in the order the model wrote them ("reasoning" or "content" with
    its text, "tool_call" with a ``ToolCallDelta``); see ``in_order``."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenRecord] = field(default_factory=list)
    reasoning_tokens: int = 0
    """Of ``token_ids``, those written inside a thinking block (not its markers: ``ChoiceState``)."""
    cut_call: int | None = None
    """At the finish: the index of the call the output ended inside, before its closing tag."""
    finish_reason: str | None = None
    stop_sequence: str | None = None
    """The stop string that ended the choice (with ``finish_reason`` "stop")."""
    stop_reason: str | int | None = None
    """vLLM's ``stop_reason`` (with ``finish_reason``): the stop string that ended the choice, or the token
    of the request's ``stop_token_ids`` that did; None for the model's end of turn, a length or a tool call."""

    def in_order(self) -> list[tuple[str, object]]:
        """The delta's reasoning, content and call pieces in the order the model wrote them: one engine round
        may carry several tokens (a speculative round), so text after a call, or a call's arguments after
        the text that follows it, may come in one delta."""
        if self.pieces:
            return self.pieces
        out: list[tuple[str, object]] = []
        if self.reasoning:
            out.append(("reasoning", self.reasoning))
        if self.content:
            out.append(("content", self.content))
        out += [("tool_call", piece) for piece in self.tool_calls]
        return out

    @property
    def has_text(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    @property
    def has_output(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.token_ids)


class ChoiceState:
    """Tracks one choice; ``feed`` per engine batch, ``finish`` once at the end."""

    def __init__(self, index: int, tokenizer: TextTokenizer, *, stops: tuple[str, ...] = (),
                 stop_token_ids: tuple[int, ...] = (), parser: OutputParser | None = None, min_tokens: int = 0,
                 prompt_index: int = 0, include_stop: bool = False, skip_special_tokens: bool = True,
                 ignore_eos: bool = False, scoring_only: bool = False):
        """``scoring_only``: the choice shows none of the engine's tokens and ends with "length" (a
        completion's ``echo`` with ``max_tokens`` 0: its prompt is the answer)."""
        self.index = index
        self.scoring_only = scoring_only
        self.prompt_index = prompt_index  # which prompt of a request with several (/v1/completions)
        # a stop token's text is shown with include_stop (vLLM's include_stop_str_in_output); held back only
        # where the output may stop on a special token whose text is left out
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens,
                                            hold_specials=not (ignore_eos or include_stop))
        self.stops = StopMatcher(stops, include_stop)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.parser = parser
        self.unmatched = min_tokens if stops else 0  # tokens whose text no stop string is looked for in
        self.token_ids: list[int] = []
        self.prompt_scores: list[PromptLogprobs] = []  # the engine's scores of the prompt, when asked
        self.reasoning_tokens = 0  # tokens written inside the thinking block (its markers not counted)
        self.finished = False
        self._plain = not stops and not stop_token_ids and parser is None
        """Text is all content, nothing to match: tokens without logprobs need only detokenizing."""

    @property
    def stopped_early(self) -> bool:
        """The choice's output is complete before the engine ended it: a stop string matched, or a tool
        call past the parser's ``max_calls`` began (``parallel_tool_calls: false``). Its engine stream is
        aborted; it finishes with "stop" (or "tool_calls") and the tokens it kept."""
        return self.stops.stopped or (self.parser is not None and self.parser.past_max_calls)

    def feed(self, *streams: StreamTokens) -> ChoiceDelta:
        """The delta of one or more consecutive engine batches of this choice."""
        return self.feed_tokens([(s.token_ids, s.logprobs) for s in streams])

    def feed_tokens(self, batches: list[tuple[tuple[int, ...], TokenLogprobs | None]]) -> ChoiceDelta:
        """``feed`` of the batches' ``(token ids, logprobs or None)``, as the engine client routes them."""
        if self.scoring_only:
            return ChoiceDelta(self.index)
        if self._plain and not self.finished:
            # the common case (no stop strings, no parser, no logprobs): the text is the detokenized ids
            if len(batches) == 1:
                ids, lp = batches[0]
            else:
                ids, lp = [t for b, _ in batches for t in b], next((lp for _, lp in batches if lp is not None), None)
            if lp is None:
                self.token_ids.extend(ids)
                return ChoiceDelta(self.index, content=self.detok.push(ids), token_ids=list(ids))
        delta = ChoiceDelta(self.index)
        if self.finished or self.stopped_early:
            return delta
        text_parts = []
        capped = self.parser is not None and self.parser.max_calls is not None
        for ids, lp in batches:
            if self._feed(ids, lp, delta, text_parts):
                break
            if capped:  # parsed batch by batch: the tokens after the call that ends the choice are not its
                self._parse("".join(text_parts), delta)
                text_parts.clear()
                if self.parser.past_max_calls:
                    break
        self.token_ids.extend(delta.token_ids)
        self._parse("".join(text_parts), delta)
        return delta

    def _feed(self, ids: tuple[int, ...], lp: TokenLogprobs | None, delta: ChoiceDelta, text_parts: list[str]
              ) -> bool:
        """Add one batch's tokens; True once a stop string matched (or a call past ``max_calls`` began). With a
        parser, token by token while the thinking block may go on (its tokens are counted), when logprobs
        are asked (each record says what its token's text became) and when calls are capped (the output ends
        at the token that began the next); else the batch's text is parsed with the rest of the delta's."""
        stop_ids = self.stop_token_ids
        parser = self.parser
        each = parser is not None and (lp is not None or not parser.past_reasoning or parser.max_calls is not None)
        if not each and lp is None and not self.stops.stops and not (stop_ids and not stop_ids.isdisjoint(ids)):
            delta.token_ids.extend(ids)  # the common case: no per-token work but detokenizing
            text = self.detok.push(ids)
            if text:
                text_parts.append(text)
            return False
        if each and text_parts:  # what earlier batches of this delta wrote comes first
            self._parse("".join(text_parts), delta)
            text_parts.clear()
        for i, token in enumerate(ids):
            delta.token_ids.append(token)
            kind, stopped, early = None, False, False
            if token not in stop_ids or self.stops.include_stop:
                text = self.detok.push((token,))
                if self.unmatched:
                    self.unmatched -= 1
                elif text:
                    late = self.detok.late
                    text = self.stops.push(text)
                    stopped = self.stops.stopped
                    # the match ended in a special token's text held from the token before: that one
                    # completed it and ends the choice; this token is not the choice's
                    early = stopped and self.stops.match_end <= late
                if each:
                    kind = self._parse_token(text, delta, counted=not early)
                elif text:
                    text_parts.append(text)
                if early:
                    delta.token_ids.pop()
                    return True
            if lp is not None:
                top = tuple(zip(lp.top_ids[i], lp.top_logprobs[i]))
                delta.logprobs.append(TokenRecord(token, lp.logprobs[i], top, kind))
            if stopped or (each and parser.past_max_calls):  # the rest is not this choice's
                return True
        return False

    def _parse_token(self, text: str, delta: ChoiceDelta, counted: bool = True) -> str | None:
        """Parse one token's ``text``; -> the kind of the first piece the parser gave out (None: nothing).
        The token is a reasoning token when the thinking block was open before it and still is after it
        (``counted``: the token is the choice's)."""
        parser = self.parser
        inside = counted and parser.in_reasoning
        events = parser.push(text) if text else []
        if inside and parser.in_reasoning:
            self.reasoning_tokens += 1
            delta.reasoning_tokens += 1
        self._apply(events, delta)
        return events[0][0] if events else None

    def finish(self, engine_reason: str) -> ChoiceDelta:
        """Flush held text; ``engine_reason`` is the engine's finish reason (stop, length, abort, error)."""
        delta = ChoiceDelta(self.index)
        if self.finished:
            return delta
        self.finished = True
        if self.scoring_only:
            delta.finish_reason = engine_reason if engine_reason in ("abort", "error") else "length"
            return delta
        if self.parser is None or not self.parser.past_max_calls:  # else what is held opens a call left out
            text = ""
            if not self.stops.stopped:
                text = self.stops.push(self.detok.finish(stopped=engine_reason == "stop"))
                if not self.stops.stopped:
                    text += self.stops.finish()
            self._parse(text, delta)
            if self.parser is not None:
                self._apply(self.parser.finish(), delta)
                delta.cut_call = self.parser.cut_call
        # abort / error pass through: the caller decides what the client sees.
        reason = "stop" if self.stopped_early else engine_reason
        delta.stop_sequence = delta.stop_reason = self.stops.matched
        if reason == "stop" and self.stops.matched is None and self.token_ids and (
                self.token_ids[-1] in self.stop_token_ids):
            delta.stop_reason = self.token_ids[-1]
        if reason == "stop" and self.parser is not None and self.parser.num_tool_calls:
            reason = "tool_calls"
        delta.finish_reason = reason
        return delta

    def _parse(self, text: str, delta: ChoiceDelta) -> None:
        if not text:
            return
        if self.parser is None:
            delta.content += text
        else:
            self._apply(self.parser.push(text), delta)

    @staticmethod
    def _apply(events, delta: ChoiceDelta) -> None:
        pieces = delta.pieces
        for kind, value in events:
            if kind == "content":
                delta.content += value
            elif kind == "reasoning":
                delta.reasoning += value
            else:
                delta.tool_calls.append(value)
                pieces.append((kind, value))
                continue
            if pieces and pieces[-1][0] == kind:
                pieces[-1] = (kind, pieces[-1][1] + value)
            else:
                pieces.append((kind, value))
