"""The part mark: where the final text part of the newest multi-part user message starts, in tokens.

Agent CLIs send a user message made of several content parts: a long,
unchanging preamble (skills, system reminders) and then the user's own
words as the final text part. Everything before that final part repeats on
the next run, so the engine captures a state image there.

    full     = prompt_ids                        (rendered with every part)
    stripped = tokens(render(messages up to that one, its final text part removed,
                             no generation prompt))
    part_end = len(common token prefix of full and stripped)

The common prefix is an exact prefix of the prompt by construction, so a
mark never depends on how the template renders a block alone. It is kept
only when it leaves tokens on both sides and comes no later than the
generation opener. Single-part messages get no mark (their boundary is the
end of the previous turn, which the prompt checkpoint already covers).
"""

from __future__ import annotations

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.tokenizer import TextTokenizer
from ignis.gateway.turn_boundaries import common_prefix_len


def newest_multipart_user(messages: list[dict]) -> int | None:
    """Index of the newest user message whose content is several parts ending in a text part."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, list) and len(content) > 1 \
                and isinstance(content[-1], dict) and content[-1].get("type") == "text":
            return i
    return None


def part_end(template: ChatTemplate, tok: TextTokenizer, messages: list[dict], tools: list[dict] | None,
             extra: dict | None, prompt_ids: list[int], opener_start: int | None) -> int | None:
    """The part mark of this conversation (a token index into ``prompt_ids``), or None."""
    at = newest_multipart_user(messages)
    if at is None:
        return None
    # the messages after it are left out: they render after the point where the two texts part, so they
    # cannot move it, and an agent's first message is often its only multi-part one, ahead of a 100K-token
    # history that was rendered and tokenized a second time for nothing
    stripped = list(messages[:at + 1])
    stripped[at] = dict(messages[at], content=messages[at]["content"][:-1])
    try:
        text = template.render(stripped, tools, add_generation_prompt=False, extra=extra)
    except TemplateRenderError:
        return None
    n = common_prefix_len(prompt_ids, tok.encode(text))
    limit = opener_start if opener_start is not None else len(prompt_ids)
    return n if 0 < n < len(prompt_ids) and n <= limit else None
