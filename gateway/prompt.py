"""A chat request's prompt: rendered, tokenized, with the capture marks the engine cuts prefill at.

    full     = render(messages, tools, add_generation_prompt=True)     -> prompt_ids
    system   = render(leading system messages, tools, no generation prompt)
    history  = render(messages, tools, no generation prompt)           (ends where the opener starts)

    system_end   = len(tokens(system))   kept only if those tokens are an exact prefix of prompt_ids
    opener_start = len(tokens(history))  kept only if an exact prefix (and shorter than the prompt)

A mark the template cannot render alone (some templates insist on a user turn)
is simply left out. ``starts_in_reasoning`` says the rendered generation
prompt opened a ``<think>`` block the model continues.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.messages import last_is_user
from ignis.gateway.output_parser import THINK_CLOSE, THINK_OPEN
from ignis.gateway.tokenizer import TextTokenizer


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    ids: list[int]
    system_end: int | None
    opener_start: int | None
    last_is_user: bool
    starts_in_reasoning: bool


def _prefix_len(ids: list[int], prefix: list[int]) -> int | None:
    n = len(prefix)
    if 0 < n < len(ids) and ids[:n] == prefix:
        return n
    return None


def _render_part(template: ChatTemplate, messages, tools, extra) -> str | None:
    try:
        return template.render(messages, tools, add_generation_prompt=False, extra=extra)
    except TemplateRenderError:
        return None


def _opens_think(opener: str) -> bool:
    """The generation opener leaves a ``<think>`` block open."""
    at = opener.rfind(THINK_OPEN)
    return at >= 0 and THINK_CLOSE not in opener[at:]


def build_chat_prompt(template: ChatTemplate, tok: TextTokenizer, messages: list[dict], tools: list[dict] | None,
                      extra: dict | None = None) -> ChatPrompt:
    """Raises ``TemplateRenderError`` when the template refuses the conversation."""
    text = template.render(messages, tools, add_generation_prompt=True, extra=extra)
    ids = tok.encode(text)
    n_system = 0
    while n_system < len(messages) and messages[n_system]["role"] in ("system", "developer"):
        n_system += 1
    system_end = None
    if n_system or tools:
        system_text = _render_part(template, messages[:n_system], tools, extra)
        if system_text:
            system_end = _prefix_len(ids, tok.encode(system_text))
    history = _render_part(template, messages, tools, extra)
    opener_start = _prefix_len(ids, tok.encode(history)) if history else None
    if system_end is not None and opener_start is not None and system_end > opener_start:
        system_end = None
    opener = text[len(history):] if history is not None and text.startswith(history) else ""
    return ChatPrompt(text=text, ids=ids, system_end=system_end, opener_start=opener_start,
                      last_is_user=last_is_user(messages), starts_in_reasoning=_opens_think(opener))
