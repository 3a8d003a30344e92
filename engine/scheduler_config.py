"""``SchedulerConfig``: the scheduler's limits, checked at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.engine.page_pool import PAGE_TOKENS
from ignis.shared.flags import field_doc
from ignis.shared.wire_fields import MAX_TOKEN_ID


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the scheduler; ``num_pages`` and ``eos_token_ids`` come from the model and memory plan."""

    decode_lanes: int = field(default=8, metadata=field_doc("sequences decoding at once (live recurrent states)"))
    num_pages: int = field(default=1024, metadata=field_doc("KV pages in the pool", cli=False))
    max_prefill_tokens_per_round: int = field(
        default=2048, metadata=field_doc("prompt tokens prefilled per round, all requests together"))
    max_queue: int = field(default=256, metadata=field_doc("requests waiting for a lane before new ones are refused"))
    max_model_len: int = field(default=32768, metadata=field_doc("most tokens (prompt + completion) per request"))
    page_tokens: int = field(default=PAGE_TOKENS, metadata=field_doc("tokens per KV page", cli=False))
    eos_token_ids: tuple[int, ...] = field(default=(), metadata=field_doc("the model's end tokens", cli=False))
    speculative_tokens: int = field(default=0, metadata=field_doc(
        "draft positions each decode may verify past its own (0: no speculation)", cli=False))
    image_token_id: int | None = field(default=None, metadata=field_doc(
        "the model's image placeholder token (None: the model takes no images)", cli=False))
    image_factor: int = field(default=32, metadata=field_doc(
        "pixels per image placeholder token along each side (patch size x merge size)", cli=False))
    scored_row_cost: int = field(default=1, metadata=field_doc(
        "prefill budget a prompt row that is scored (prompt_logprobs) takes, in prompt tokens: 1 plus the LM "
        "head's share of a token's work", cli=False))
    tier_wait_limit_s: float = field(default=2.0, metadata=field_doc(
        "the most a request at the head of its queue waits for tierd to look up and copy back its lower-tier "
        "match before it computes from its device match instead (tierd slow or frozen); the requests behind "
        "it then stop asking tierd until it answers again", cli=False))
    capture_inside_chunks: bool = field(default=True, metadata=field_doc(
        "a prefill chunk crosses capture marks, the forward keeping the state image at each (False: chunks "
        "end on the marks; the hq-e8-2b pool, whose exact window is lane state, needs it)", cli=False))

    def __post_init__(self):
        for name, flag in (("decode_lanes", "--decode-lanes"), ("num_pages", "num_pages"),
                           ("max_prefill_tokens_per_round", "--max-prefill-tokens-per-round"),
                           ("max_queue", "--max-queue"), ("max_model_len", "--max-model-len"),
                           ("page_tokens", "page_tokens"), ("scored_row_cost", "scored_row_cost")):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        if self.max_model_len > self.num_pages * self.page_tokens:
            raise ValueError(f"--max-model-len {self.max_model_len} exceeds the KV pool "
                             f"({self.num_pages} pages x {self.page_tokens} = {self.num_pages * self.page_tokens} tokens)")
        if type(self.speculative_tokens) is not int or self.speculative_tokens < 0:
            raise ValueError(f"--speculative-tokens must be an integer >= 0, got {self.speculative_tokens!r}")
        eos = tuple(self.eos_token_ids)
        if any(type(t) is not int or not 0 <= t <= MAX_TOKEN_ID for t in eos):
            raise ValueError(f"eos_token_ids must be token ids, got {eos!r}")
        object.__setattr__(self, "eos_token_ids", eos)


def scored_row_cost(vocab_size: int, hidden_size: int, weights: int, tied: bool) -> int:
    """The prefill budget a scored prompt row takes: 1 (its pass through the layers) plus the LM head's work
    over the layers' (multiply-accumulates per row: the head's vocabulary x hidden against the weights less
    the embedding and the untied head), rounded. 1 on the real models (the 27B's head is 5% of a token's
    work); 25 on the demo model, whose head is most of it."""
    head = vocab_size * hidden_size
    layers = max(1, weights - head * (1 if tied else 2))
    return 1 + round(head / layers)
