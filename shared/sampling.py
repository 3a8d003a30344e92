"""Per-request sampling parameters, as the gateway sends them and the engine applies them.

One frozen dataclass; every field is checked when it is built, with the same
limits whether it comes from the gateway's own code or off the wire. Disabled
filters have neutral values: ``top_p = 1``, ``top_k = 0``, ``min_p = 0``,
penalties 0 (presence, frequency) and 1 (repetition), no logit bias,
``min_tokens = 0``, every token allowed, no bad words, no thinking budget, no prompt scoring. ``n`` is not here: the
gateway fans a request with several choices out into one stream per choice.

No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.shared.wire_fields import (
    MAX_TOKEN_ID,
    check_bool,
    check_float,
    check_int,
    check_opt_int,
    check_token_ids,
)

MAX_TOP_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries
MAX_ALLOWED_TOKEN_IDS = 65536
MAX_BAD_WORDS = 128  # token sequences (vLLM's VLLM_MAX_NUM_BAD_WORDS)
MAX_BAD_WORD_TOKENS = 64  # tokens in one sequence
MAX_THINKING_END_TOKENS = 16  # tokens of the forced end of a thinking block
MAX_THINKING_BUDGET = 2**31 - 1  # tokens a thinking block may take
LOGIT_BIAS_LIMIT = 100.0  # |bias|, as OpenAI's API bounds it
GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's)
MIN_TEMPERATURE = 1e-2  # any other under this is raised to it (vLLM's): logits / 1e-39 overflow to inf


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop."""

    temperature: float = 1.0
    """0 means greedy; otherwise logits are divided by it. Range [0, 100]; as in vLLM, a temperature
    under 1e-5 is taken as 0 and one in [1e-5, 0.01) as 0.01 (a tiny divisor overflows the logits)."""
    top_p: float = 1.0
    """Nucleus mass kept, in (0, 1]; 1 keeps everything."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    min_p: float = 0.0
    """Drop tokens below min_p times the top token's probability, in [0, 1]."""
    presence_penalty: float = 0.0
    """Subtracted once from a token's logit if it was generated before, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted per earlier occurrence in the output, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens seen in prompt or output, in (0, 100]."""
    seed: int | None = None
    """Per-request RNG seed in [0, 2**63); None draws from the engine's generator."""
    max_tokens: int = 16
    """Most completion tokens, >= 1 (the engine also stops at the model length)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the stream (the stop token is part of the output)."""
    ignore_eos: bool = False
    """Keep going past the model's end-of-sequence tokens."""
    logprobs: bool = False
    """Return the chosen tokens' log probabilities."""
    top_logprobs: int = 0
    """Also return this many most likely alternatives per token, in [0, 20]; needs logprobs."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs, ids ascending and distinct, each bias in [-100, 100]: added to those
    logits before penalties, temperature and the filters (logprobs stay the raw model's)."""
    min_tokens: int = 0
    """No end-of-sequence token (unless ``ignore_eos``) and no ``stop_token_ids`` before this many output
    tokens, in [0, max_tokens]."""
    allowed_token_ids: tuple[int, ...] = ()
    """Only these ids may be sampled (ascending, distinct; empty: every id). Applied before the logit
    bias and penalties; logprobs stay the raw model's."""
    bad_words: tuple[tuple[int, ...], ...] = ()
    """vLLM's bad words as token sequences (at most 128, each 1 to 64 ids): a sequence's last id is never
    sampled where the output so far ends with the ids before it (a one-id sequence: never sampled).
    Applied with ``allowed_token_ids``, before the bias; logprobs stay the raw model's."""
    thinking_budget: int | None = None
    """vLLM's ``thinking_token_budget``: at most this many generated tokens inside a ``<think>`` block
    (``engine.thinking_budget``); once they are out and the block is still open, ``thinking_end_ids`` are
    forced one a step. None: no budget (and the four fields below neutral). Logprobs stay the raw model's."""
    thinking_open: bool = False
    """The prompt left a thinking block open: counting starts at the first generated token."""
    think_start_id: int | None = None
    """The ``<think>`` id: as the first generated token it opens a block (None: only the prompt opens one)."""
    think_end_id: int | None = None
    """The ``</think>`` id: generated inside the block, it closes it (counting stops, nothing is forced)."""
    thinking_end_ids: tuple[int, ...] = ()
    """The forced end of a block (1 to 16 ids holding ``think_end_id``; Qwen's ``"\\n</think>\\n\\n"``)."""
    prompt_logprobs: int | None = None
    """Also score the prompt: each prompt token's log probability given the tokens before it, its rank,
    and this many most likely alternatives, in [0, 20]; None: not scored. A scored prompt is computed
    whole (nothing is resumed from retained state)."""

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "temperature", _effective_temperature(check_float("temperature", self.temperature, 0.0, 100.0)))
        set_(self, "top_p", check_float("top_p", self.top_p, 0.0, 1.0))
        if self.top_p == 0.0:
            raise ValueError("top_p must be in (0, 1], got 0")
        check_int("top_k", self.top_k, 0, MAX_TOKEN_ID)
        set_(self, "min_p", check_float("min_p", self.min_p, 0.0, 1.0))
        set_(self, "presence_penalty", check_float("presence_penalty", self.presence_penalty, -2.0, 2.0))
        set_(self, "frequency_penalty", check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0))
        set_(self, "repetition_penalty", check_float("repetition_penalty", self.repetition_penalty, 0.0, 100.0))
        if self.repetition_penalty == 0.0:
            raise ValueError("repetition_penalty must be in (0, 100], got 0")
        check_opt_int("seed", self.seed, 0, 2**63 - 1)
        check_int("max_tokens", self.max_tokens, 1, 2**31 - 1)
        set_(self, "stop_token_ids", check_token_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS))
        check_bool("ignore_eos", self.ignore_eos)
        check_bool("logprobs", self.logprobs)
        check_int("top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS)
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        set_(self, "logit_bias", check_logit_bias(self.logit_bias))
        check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        check_opt_int("prompt_logprobs", self.prompt_logprobs, 0, MAX_TOP_LOGPROBS)
        allowed = check_token_ids("allowed_token_ids", self.allowed_token_ids, MAX_ALLOWED_TOKEN_IDS)
        if any(b <= a for a, b in zip(allowed, allowed[1:])):
            raise ValueError("allowed_token_ids must be ascending and distinct")
        set_(self, "allowed_token_ids", allowed)
        set_(self, "bad_words", check_bad_words(self.bad_words))
        set_(self, "thinking_end_ids", self._check_thinking())

    def _check_thinking(self) -> tuple[int, ...]:
        """The thinking budget's fields, consistent: all neutral without a budget; with one, an end id
        inside the forced end, and a way for a block to open."""
        budget = check_opt_int("thinking_budget", self.thinking_budget, 0, MAX_THINKING_BUDGET)
        check_bool("thinking_open", self.thinking_open)
        check_opt_int("think_start_id", self.think_start_id, 0, MAX_TOKEN_ID)
        check_opt_int("think_end_id", self.think_end_id, 0, MAX_TOKEN_ID)
        end = check_token_ids("thinking_end_ids", self.thinking_end_ids, MAX_THINKING_END_TOKENS)
        if budget is None:
            if self.thinking_open or self.think_start_id is not None or self.think_end_id is not None or end:
                raise ValueError("thinking_open, think_start_id, think_end_id and thinking_end_ids need a "
                                 "thinking_budget")
            return end
        if self.think_end_id is None or self.think_end_id not in end:
            raise ValueError("a thinking_budget needs think_end_id, and thinking_end_ids holding it")
        if not self.thinking_open and self.think_start_id is None:
            raise ValueError("a thinking_budget needs thinking_open or think_start_id (a block that can open)")
        return end

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _effective_temperature(t: float) -> float:
    if t < GREEDY_BELOW:
        return 0.0
    return max(t, MIN_TEMPERATURE)


def check_logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """``(token id, bias)`` pairs with ascending distinct ids and biases in [-100, 100]; floats widened."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"logit_bias must be a list of [token id, bias] pairs, got {type(value).__name__}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias has {len(value)} entries, at most {MAX_LOGIT_BIAS} allowed")
    out, last = [], -1
    for i, pair in enumerate(value):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"logit_bias[{i}] must be a [token id, bias] pair")
        token = check_token_ids(f"logit_bias[{i}]", (pair[0],))[0]
        if token <= last:
            raise ValueError(f"logit_bias ids must be ascending and distinct, got {token} after {last}")
        out.append((token, check_float(f"logit_bias[{i}]", pair[1], -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)))
        last = token
    return tuple(out)


def check_bad_words(value: object) -> tuple[tuple[int, ...], ...]:
    """At most ``MAX_BAD_WORDS`` token sequences, each of 1 to ``MAX_BAD_WORD_TOKENS`` ids; lists become tuples."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"bad_words must be a list of token id sequences, got {type(value).__name__}")
    if len(value) > MAX_BAD_WORDS:
        raise ValueError(f"bad_words has {len(value)} sequences, at most {MAX_BAD_WORDS} allowed")
    out = []
    for i, word in enumerate(value):
        ids = check_token_ids(f"bad_words[{i}]", word, MAX_BAD_WORD_TOKENS)
        if not ids:
            raise ValueError(f"bad_words[{i}] must not be empty")
        out.append(ids)
    return tuple(out)
