"""Continuing the final assistant message (vLLM's ``continue_final_message``, Anthropic's prefill).

The model writes on from the last message's text instead of opening a new
turn. The conversation is rendered whole without the generation prompt and
cut right after the final message's text, as vLLM cuts it: where its content
last occurs after the turns before it (as given, or trimmed, since templates
such as Qwen3.5's trim message content) and before the markup the template
writes after it (found by a second render with a mark after the text). A
template that does not render that text verbatim cannot be continued: a 400,
never a guess.

The final message must be an assistant message with text content and no
tool calls. Its text is the prompt's; the answer holds only what follows.
No torch.
"""

from __future__ import annotations

import os

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.errors import invalid


CUT_MARK = "\u2063ignis-cut\u2063"
"""Written after the final message's text in a second render: where the two renders part is where the text
ends, so a text that also occurs in the markup the template writes after it (``>``, ``|``, ``end``) is
found where the message is, not in ``<|im_end|>``."""


def final_text(messages: list[dict], joiner: str = "") -> str:
    """The text of the message to continue (text parts joined by ``joiner``, as the template gets them); a
    400 when the conversation does not end with one."""
    if not messages or messages[-1].get("role") != "assistant":
        raise invalid("continue_final_message needs the last message to be an assistant message",
                      "continue_final_message")
    final = messages[-1]
    if final.get("tool_calls"):
        raise invalid("the final assistant message holds tool calls: only text can be continued",
                      f"messages[{len(messages) - 1}].tool_calls")
    content = final.get("content")
    if isinstance(content, list):  # text parts only: image parts are refused in assistant messages
        content = joiner.join(part.get("text", "") for part in content)
    if not isinstance(content, str) or not content.strip():
        raise invalid("the final assistant message needs text to continue", f"messages[{len(messages) - 1}].content")
    return content


def continued_text(template: ChatTemplate, messages: list[dict], tools: list[dict] | None,
                   extra: dict | None) -> str:
    """The conversation rendered up to the end of its final message's text (raises
    ``TemplateRenderError`` as rendering does)."""
    content = final_text(messages, "\n" if template.joins_parts else "")
    text = template.render(messages, tools, add_generation_prompt=False, extra=extra)
    try:  # the text is looked for after the turns before it, never in an earlier message
        before = template.render(messages[:-1], tools, add_generation_prompt=False, extra=extra)
        floor = len(os.path.commonprefix([before, text]))
    except TemplateRenderError:
        floor = 0
    try:  # ... and ends no later than where a render with a mark after it parts from this one
        marked = template.render(messages[:-1] + [_marked(messages[-1])], tools, add_generation_prompt=False,
                                 extra=extra)
        limit = len(os.path.commonprefix([marked, text])) if CUT_MARK in marked else len(text)
    except TemplateRenderError:
        limit = len(text)
    for needle in (content, content.rstrip(), content.strip()):
        at = text.rfind(needle, floor, limit)
        if at >= 0:
            return text[:at + len(needle)]
    raise invalid("the chat template does not render the final assistant message's text as given, so it "
                  "cannot be continued", f"messages[{len(messages) - 1}].content")


def _marked(message: dict) -> dict:
    """``message`` with ``CUT_MARK`` after its text (after its last text part)."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": content + CUT_MARK}
    parts = list(content)
    last = max(i for i, part in enumerate(parts) if isinstance(part, dict) and "text" in part)
    parts[last] = {**parts[last], "text": parts[last]["text"] + CUT_MARK}
    return {**message, "content": parts}
