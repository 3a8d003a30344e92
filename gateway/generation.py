"""One HTTP request's engine streams: n Generates out, merged ChoiceDeltas in, aborts on the way out.

    open()    send one Generate per choice; wait until every choice has its first answer
              (a Refused anywhere aborts the rest and raises the matching ApiError); a
              choice's prompt scores (``PromptLogprobs``, before its first tokens) go to
              its ``ChoiceState.prompt_scores`` as they arrive, so they are all there then;
              a choice's ``Admitted`` (also before its first tokens) puts its prompt's cached
              tokens in ``usage`` (an Anthropic ``message_start`` reports them), and its Finished
              confirms them
    deltas()  yields ChoiceDelta as tokens arrive, then each choice's final delta
    close()   aborts every choice the engine has not finished (client gone, error, stop string)

Waiting never blocks forever: a timer every 0.5 s (one per request, not one per
wait) checks, while the request waits, the client connection (gone:
``ClientGone``) and the engine (silent for longer than its timeout:
``EngineUnavailable``, HTTP 503 or an SSE error). A stop string match aborts
that choice at the engine and keeps reading until its Finished, whose usage is
then reported with the tokens up to the match.

Tokens of one choice that arrived together (several engine rounds queued while
the client was written to) are fed as one batch, so they leave as one delta:
one SSE chunk. ``take()`` makes every delta that what is queued allows at
once (a choice's last tokens and its final delta, the choices of n > 1), so a
streamed response writes them in one write; ``wait()`` is the one future a
request awaits between wake-ups.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ignis.gateway.choice import ChoiceDelta, ChoiceState
from ignis.gateway.engine_client import EngineClient, EngineUnavailable
from ignis.gateway.errors import RETRY_AFTER_S, ApiError, engine_unavailable, from_refusal
from ignis.shared.wire import Admitted, Finished, Generate, PromptLogprobs, Refused, TokenLogprobs

POLL_S = 0.5


class ClientGone(Exception):
    """The HTTP client closed its connection."""


class EngineFailed(Exception):
    """The engine ended a stream with an error (500; 400 when the request's own constraints failed it), or
    aborted it on its own, e.g. shutting down (503)."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


class StreamInbox:
    """One request's engine answers in arrival order; the engine client puts, the request awaits.

    An item is ``(engine id, token ids, TokenLogprobs or None)`` for a stream's tokens of one round, or
    ``(engine id, PromptLogprobs | Admitted | Finished | Refused, None)``. A wait costs one future; ``fail``
    wakes a waiter with an exception. With a pump (``pump_with``), arrivals call it instead, once per turn of the loop that
    brought any (after the engine reader's turn, so one turn's items go together), and the waiter is
    left for the pump to ``wake`` or ``fail``."""

    def __init__(self):
        self.items: collections.deque[tuple[str, object, object]] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._pump: Callable[[], None] | None = None
        self._pump_due = False

    def put_nowait(self, item: tuple[str, object, object]) -> None:
        self.items.append(item)
        if self._pump is not None:
            self._schedule_pump()
        else:
            self.wake()

    def pump_with(self, pump: Callable[[], None] | None) -> None:
        """Call ``pump`` when items arrive (None: wake the waiter again); called at once if some are queued."""
        self._pump = pump
        if pump is not None and self.items:
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        """Once per turn of the loop, however many items arrive in it."""
        if not self._pump_due:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._run_pump)

    def _run_pump(self) -> None:
        self._pump_due = False
        if self._pump is not None:
            self._pump()

    @property
    def waiting(self) -> bool:
        w = self._waiter
        return w is not None and not w.done()

    def waiter(self) -> asyncio.Future:
        """A future done when an item arrives (or failed by ``fail``): await it when ``items`` is empty."""
        self._waiter = fut = asyncio.get_running_loop().create_future()
        return fut

    async def wait(self) -> None:
        """Until an item arrives (or ``fail``)."""
        await self.waiter()

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def fail(self, exc: BaseException) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(exc)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None
    """Of ``completion_tokens``, those written inside a thinking block; None where no output is parsed for
    reasoning (``completion_tokens_details`` is left out then)."""

    def to_json(self) -> dict:
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


class Generation:
    def __init__(self, client: EngineClient, messages: list[Generate], choices: list[ChoiceState],
                 disconnected: Callable[[], bool] = lambda: False):
        if len(messages) != len(choices):
            raise ValueError("one Generate per choice")
        self.client = client
        self.messages = messages
        self.choices = choices
        self.by_id = {m.id: c for m, c in zip(messages, choices)}
        self.finished: dict[str, Finished] = {}
        self.disconnected = disconnected
        self.inbox = StreamInbox()
        self._early: collections.deque[tuple[str, object, object]] = collections.deque()
        self._tick: asyncio.TimerHandle | None = None
        # per prompt (a completions request may hold several): its length, then what its first choice's
        # Finished says (prompt tokens, cached tokens); usage sums them
        self._prompt_usage: dict[int, tuple[int, int]] = {}
        self._counts_prompt: set[int] = set()  # the choice indexes that report their prompt's usage
        for m, c in zip(messages, choices):
            if c.prompt_index not in self._prompt_usage:
                self._prompt_usage[c.prompt_index] = (len(m.prompt_ids), 0)
                self._counts_prompt.add(c.index)
        self.usage = Usage(prompt_tokens=sum(n for n, _ in self._prompt_usage.values()),
                           reasoning_tokens=0 if any(c.parser is not None and c.parser.reasoning for c in choices)
                           else None)

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    # ----- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        self._tick = asyncio.get_running_loop().call_later(POLL_S, self._check)
        self.client.open(self.messages, self.inbox)
        waiting = set(self.by_id)
        while waiting:
            engine_id, item, lp = await self._get()
            if isinstance(item, Refused):
                self.close()
                raise from_refusal(item.reason, item.message)
            if type(item) is PromptLogprobs:
                self._scored(engine_id, item)
                continue
            if type(item) is Admitted:
                self._admitted(engine_id, item)
                continue
            waiting.discard(engine_id)
            self._early.append((engine_id, item, lp))

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for m in self.messages:
            if m.id not in self.finished:
                self.client.abort(m.id)

    # ----- output ----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Every choice has its Finished (or Refused)."""
        return len(self.finished) == len(self.messages)

    @property
    def pending(self) -> bool:
        """Something is queued that ``take()`` has not taken."""
        return bool(self._early or self.inbox.items)

    def wait(self) -> asyncio.Future:
        """Await when nothing is ``pending`` and not ``done``: until something arrives, or the client or
        the engine is gone (``ClientGone``, ``EngineUnavailable``)."""
        return self.inbox.waiter()

    def take(self) -> list[ChoiceDelta]:
        """The deltas of everything queued so far, in arrival order (empty: wait). A failure (EngineFailed,
        a refusal) raises once the deltas before it have been taken: it is left queued while there are some."""
        out: list[ChoiceDelta] = []
        early, items, finished, messages = self._early, self.inbox.items, self.finished, self.messages
        while len(finished) < len(messages):
            src = early if early else items
            if not src:
                break
            engine_id, item, lp = src[0]
            choice = self.by_id.get(engine_id)
            if choice is None or engine_id in finished:
                src.popleft()
                continue
            if type(item) is PromptLogprobs:  # only before a stream's first tokens: open() took them
                src.popleft()
                self._scored(engine_id, item)
                continue
            if type(item) is Admitted:  # the same
                src.popleft()
                self._admitted(engine_id, item)
                continue
            if type(item) is tuple:  # token ids
                src.popleft()
                if src is items and items and items[0][0] == engine_id:  # more of this stream queued behind
                    delta = choice.feed_tokens(self._same_stream(engine_id, item, lp))
                else:
                    delta = choice.feed_tokens([(item, lp)])
                if choice.stopped_early:  # counted as a stop, of the tokens the choice kept
                    self.client.abort(engine_id, keep_route=True, reason="stop", kept_tokens=len(choice.token_ids))
                if delta.token_ids or delta.has_output:
                    out.append(delta)
            elif out and self._fails(choice, item):
                break  # what came before goes out first; the next take raises
            else:
                src.popleft()
                finished[engine_id] = item
                if isinstance(item, Refused):  # can only follow a first answer if the engine misbehaves
                    raise EngineFailed(f"the engine refused the request: {item.message}")
                out.append(self._finish(choice, item))
        return out

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """``take()``'s deltas one by one, waiting as needed, until every choice is finished."""
        while not self.done:
            for delta in self.take():
                yield delta
            if not self.done and not self.pending:
                await self.wait()

    def _scored(self, engine_id: str, scores: PromptLogprobs) -> None:
        choice = self.by_id.get(engine_id)
        if choice is not None:
            choice.prompt_scores.append(scores)

    def _admitted(self, engine_id: str, msg: Admitted) -> None:
        """The cached part of a prompt, known at admission (its Finished says it again)."""
        choice = self.by_id.get(engine_id)
        if choice is None or choice.index not in self._counts_prompt:
            return
        prompt_tokens, _ = self._prompt_usage[choice.prompt_index]
        self._count_prompt(choice, prompt_tokens, min(msg.cached_tokens, prompt_tokens))

    def _count_prompt(self, choice: ChoiceState, prompt_tokens: int, cached_tokens: int) -> None:
        """What the engine says of ``choice``'s prompt, summed into ``usage`` over the prompts."""
        self._prompt_usage[choice.prompt_index] = (prompt_tokens, cached_tokens)
        self.usage.prompt_tokens = sum(n for n, _ in self._prompt_usage.values())
        self.usage.cached_tokens = sum(c for _, c in self._prompt_usage.values())

    @staticmethod
    def _fails(choice: ChoiceState, item: object) -> bool:
        """Whether taking ``item`` (a Finished or Refused) raises."""
        if isinstance(item, Refused):
            return True
        return item.finish_reason == "error" or (item.finish_reason == "abort" and not choice.stopped_early)

    def _finish(self, choice: ChoiceState, fin: Finished) -> ChoiceDelta:
        if fin.finish_reason == "error":
            raise EngineFailed(fin.message or "the engine failed on this request",
                               status=400 if fin.error_code == "invalid_request" else 500)
        if fin.finish_reason == "abort" and not choice.stopped_early:
            raise EngineFailed(fin.message or "the engine ended the request", status=503)
        delta = choice.finish(fin.finish_reason)
        if choice.index in self._counts_prompt:
            self._count_prompt(choice, fin.usage.prompt_tokens, fin.usage.cached_tokens)
        # a choice that ended before the engine did counts the tokens it kept (none when it only scores)
        kept = choice.stopped_early or choice.scoring_only
        self.usage.completion_tokens += len(choice.token_ids) if kept else fin.usage.completion_tokens
        if self.usage.reasoning_tokens is not None:
            self.usage.reasoning_tokens += choice.reasoning_tokens
        return delta

    def _same_stream(self, engine_id: str, token_ids: tuple[int, ...], lp
                     ) -> list[tuple[tuple[int, ...], TokenLogprobs | None]]:
        """``(token_ids, lp)`` and the tokens of the same stream queued right behind them."""
        batch, items = [(token_ids, lp)], self.inbox.items
        if self._early:
            return batch
        while items and items[0][0] == engine_id and type(items[0][1]) is tuple:
            _, more, more_lp = items.popleft()
            batch.append((more, more_lp))
        return batch

    async def _get(self) -> tuple[str, object, object]:
        items = self.inbox.items
        while not items:
            await self.inbox.waiter()
        return items.popleft()

    def _check(self) -> None:
        """Every POLL_S while open: a waiting request learns that its client or the engine is gone."""
        if self.inbox.waiting:
            if self.disconnected():
                self.inbox.fail(ClientGone())
            elif not self.client.engine_alive:
                self.inbox.fail(EngineUnavailable("the engine stopped answering"))
        self._tick = asyncio.get_running_loop().call_later(POLL_S, self._check)


def api_error_of(exc: BaseException) -> ApiError:
    """The client-facing error for a failure while generating."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EngineUnavailable):
        return engine_unavailable()
    if isinstance(exc, EngineFailed):
        if exc.status == 503:
            return ApiError(503, str(exc), code="engine_aborted", retry_after=RETRY_AFTER_S)
        if exc.status == 400:  # the request's own constraints (its grammar beside allowed_token_ids, ...)
            return ApiError(400, str(exc), code="invalid_request")
        return ApiError(500, str(exc), code="engine_error", type="server_error")
    return ApiError(500, "internal error", type="internal_error")
