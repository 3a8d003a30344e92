"""A scored prompt (``PromptLogprobs`` messages from the engine) in the two shapes clients read.

- ``prompt_logprobs_json``: vLLM's ``prompt_logprobs`` field, one entry per
  prompt token: ``None`` for the first (nothing precedes it), then an object of
  token id (as a string) to ``{"logprob", "rank", "decoded_token"}`` holding
  the prompt token itself (its rank among every token, 1 = the most likely)
  and the top alternatives asked for (ranks 1, 2, ...).
- ``echo_logprobs``: the legacy completions ``logprobs`` object of an echoed
  prompt, as OpenAI's ``echo`` with ``logprobs`` gives it: ``tokens``,
  ``token_logprobs`` (``None`` for the first token), ``top_logprobs`` (``None``
  for the first; token text to logprob), ``text_offset``; the generated
  tokens' offsets go on from its end. Tokens are named as the generated ones
  are (``CompletionLogprobs.as_ids``).

A probability of zero is -9999.0, as for generated tokens (``json_logprob``). Scores that do not
cover the prompt (the engine ended the request before its prompt was done:
the request then fails with the engine's reason) give None. No torch.
"""

from __future__ import annotations

from ignis.gateway.choice import TokenRecord
from ignis.gateway.responses import CompletionLogprobs, json_logprob, merge_completion_logprobs, token_name
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.wire import PromptLogprobs


def scored_positions(prompt_len: int, scores: list[PromptLogprobs]) -> list[tuple[float, int, tuple, tuple]] | None:
    """Per prompt token after the first: (logprob, rank, top ids, top logprobs), from ``scores`` in order;
    None unless they cover the prompt exactly once."""
    out, at = [], 1
    for m in scores:
        if m.start != at:
            return None
        lp = m.logprobs
        out.extend(zip(lp.logprobs, m.ranks, lp.top_ids, lp.top_logprobs))
        at += len(m.ranks)
    return out if at == max(prompt_len, 1) else None


def prompt_logprobs_json(prompt_ids: list[int] | tuple[int, ...], scores: list[PromptLogprobs],
                         tokenizer: TextTokenizer, top: int | None = None) -> list[dict | None] | None:
    """vLLM's ``prompt_logprobs``: ``[None, {id: {logprob, rank, decoded_token}}, ...]``; ``top``: the
    alternatives asked for (the engine may have scored more: an echo's logprobs asked for them)."""
    scored = scored_positions(len(prompt_ids), scores)
    if scored is None:
        return None
    out: list[dict | None] = [None]
    for token, (lp, rank, top_ids, top_lps) in zip(prompt_ids[1:], scored):
        entry = {str(token): {"logprob": json_logprob(lp), "rank": rank, "decoded_token": tokenizer.token_text(token)}}
        if top is not None:
            top_ids, top_lps = top_ids[:top], top_lps[:top]
        for i, (t, v) in enumerate(zip(top_ids, top_lps), start=1):
            entry.setdefault(str(t), {"logprob": json_logprob(v), "rank": i, "decoded_token": tokenizer.token_text(t)})
        out.append(entry)
    return out


def echo_logprobs(prompt_ids: list[int] | tuple[int, ...], scores: list[PromptLogprobs],
                  tokenizer: TextTokenizer, offsets: CompletionLogprobs) -> dict | None:
    """The legacy logprobs of an echoed prompt; ``offsets`` (at 0) moves past it, for the generated tokens:
    the first token as the legacy API writes it (no logprob), the rest as generated tokens are written."""
    scored = scored_positions(len(prompt_ids), scores)
    if scored is None:
        return None
    first = {"tokens": [token_name(tokenizer, prompt_ids[0], offsets.as_ids)], "token_logprobs": [None],
             "top_logprobs": [None], "text_offset": [offsets.offset]}
    offsets.offset += len(tokenizer.token_text(prompt_ids[0]))
    rest = [TokenRecord(token, lp, tuple(zip(top_ids, top_lps)))
            for token, (lp, _, top_ids, top_lps) in zip(prompt_ids[1:], scored)]
    return merge_completion_logprobs([first, offsets.add(tokenizer, rest)])
