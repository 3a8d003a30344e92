"""vLLM's ``thinking_token_budget`` request field: the cap, checked, and the ids the engine forces with it.

``parse_thinking_budget`` reads the field (a non-negative integer; absent or
null: no budget). ``for_tokenizer`` finds what the engine needs in the served
model's vocabulary: the ``<think>`` and ``</think>`` ids (single tokens in
the Qwen vocabularies) and the end the engine forces, ``"\\n</think>\\n\\n"``
tokenized, as the Qwen3.5 template closes an assistant turn's reasoning::

    <think>\\n reasoning \\n</think>\\n\\n answer

A model without a ``</think>`` token cannot take the field (a 400).
``ThinkingBudget.sampling_fields`` gives the ``SamplingParams`` fields once the
prompt is known: whether it left a block open (counting starts at once) or a
block can only open with a generated ``<think>`` (``engine.thinking_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.gateway.fields import Fields
from ignis.gateway.reasoning_split import THINK_CLOSE, THINK_OPEN
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.sampling import MAX_THINKING_BUDGET, MAX_THINKING_END_TOKENS

FIELD = "thinking_token_budget"
FORCED_END = "\n</think>\n\n"


def parse_thinking_budget(f: Fields) -> int | None:
    """The request's budget in tokens, or None."""
    return f.int(FIELD, None, 0, MAX_THINKING_BUDGET)


@dataclass(frozen=True)
class ThinkingBudget:
    """A budget with the served model's ids for it."""

    budget: int
    start_id: int | None
    """``<think>``; None: the vocabulary has none (only a prompt can open a block)."""
    end_id: int
    """``</think>``."""
    end_ids: tuple[int, ...]
    """``FORCED_END`` as the model's tokens."""

    def sampling_fields(self, opened: bool) -> dict:
        """The ``SamplingParams`` fields for a prompt that did (``opened``) or did not leave a block open;
        empty where no block can open (nothing to count)."""
        if not opened and self.start_id is None:
            return {}
        return {"thinking_budget": self.budget, "thinking_open": opened, "think_start_id": self.start_id,
                "think_end_id": self.end_id, "thinking_end_ids": self.end_ids}


def for_tokenizer(f: Fields, budget: int, tokenizer: TextTokenizer) -> ThinkingBudget:
    """``budget`` with ``tokenizer``'s ids; a 400 naming the field when the model has no ``</think>`` token."""
    end_id = tokenizer.token_id(THINK_CLOSE)
    if end_id is None:
        raise f.error(FIELD, f"this model has no {THINK_CLOSE} token: it has no thinking block to budget")
    end_ids = tuple(tokenizer.encode(FORCED_END))
    if end_id not in end_ids or len(end_ids) > MAX_THINKING_END_TOKENS:
        end_ids = (end_id,)  # a tokenizer that does not keep </think> whole in text: the token alone
    return ThinkingBudget(budget, tokenizer.token_id(THINK_OPEN), end_id, end_ids)
