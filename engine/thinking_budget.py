"""vLLM's thinking token budget in the sampler: which id a request must sample next, given its output so far.

A request with ``SamplingParams.thinking_budget`` may spend at most that many
generated tokens inside a ``<think>`` block. Once they are out and the block is
still open, the block's end (``thinking_end_ids``, Qwen's ``"\\n</think>\\n\\n"``)
is forced, one id a step; then the output runs free::

    phase      waiting --<think> first--> counting --budget spent--> forcing 0..k-1 --> done
                  |                          |
                  +--any other first id--> done <--</think> generated (nothing forced)

- ``thinking_open`` (the prompt left the block open) starts in ``counting``;
  otherwise a block opens only when the first generated token is
  ``<think>`` (that token does not count), and any other first token means
  there is no block to budget.
- ``counting`` counts the block's generated tokens; the model's own
  ``</think>`` ends it (``done``); at ``count == budget`` it becomes forcing.
- A budget of 0 forces the end at once (at the first token of the block).

Pure Python; ``forced`` is read before a token is sampled, ``record`` after.
``state`` / ``set_state`` save and restore it with the sampler's snapshot.
"""

from __future__ import annotations

from ignis.shared.sampling import SamplingParams

WAITING, COUNTING, FORCING, DONE = "waiting", "counting", "forcing", "done"


class ThinkingBudget:
    """One request's place in its thinking block: ``phase``, ``count`` (block tokens so far, while
    counting) and ``step`` (how many ids of the end are out, while forcing)."""

    def __init__(self, params: SamplingParams):
        if params.thinking_budget is None:
            raise ValueError("a ThinkingBudget needs SamplingParams.thinking_budget")
        self.budget: int = params.thinking_budget
        self.start_id: int | None = params.think_start_id
        self.end_id: int = params.think_end_id
        self.end_ids: tuple[int, ...] = params.thinking_end_ids
        self.phase, self.count, self.step = WAITING, 0, 0
        if params.thinking_open:
            self._enter_block()

    def _enter_block(self) -> None:
        self.phase, self.count = COUNTING, 0
        if self.budget == 0:
            self.phase, self.step = FORCING, 0

    @property
    def forced(self) -> int | None:
        """The id the next token must be; None: the next token is free."""
        return self.end_ids[self.step] if self.phase == FORCING else None

    def record(self, token: int) -> None:
        """``token`` was generated (when ``forced`` was set, it is that id)."""
        if self.phase == WAITING:
            if token == self.start_id:
                self._enter_block()
            else:
                self.phase = DONE
        elif self.phase == COUNTING:
            if token == self.end_id:
                self.phase = DONE
                return
            self.count += 1
            if self.count >= self.budget:
                self.phase, self.step = FORCING, 0
        elif self.phase == FORCING:
            self.step += 1
            if self.step == len(self.end_ids):
                self.phase = DONE

    def state(self) -> tuple[str, int, int]:
        return self.phase, self.count, self.step

    def set_state(self, state: tuple[str, int, int]) -> None:
        self.phase, self.count, self.step = state
