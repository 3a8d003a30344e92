"""A chat request's prompt: rendered, tokenized, with the capture marks the engine keeps state images at.

    full         = render(messages, tools, add_generation_prompt=True)   -> prompt_ids
    system_end   = where the system + tools block ends in prompt_ids       (gateway.capture_marks)
    opener_start = where the generation opener starts in prompt_ids       (gateway.capture_marks)

A mark that cannot be found leaves its field out and is named in
``mark_missing`` (``"system_end: not_a_prefix"``), which travels to the
engine's done line; the request is served all the same. One ``MarkFinder``
(and its cache) is kept per template and tokenizer. ``starts_in_reasoning``
says the rendered generation prompt opened a ``<think>`` block the model
continues.

``continue_final``: the model continues the final assistant message
(``gateway.continuation``); the marks are those of the conversation before
it with its generation prompt, kept where this prompt starts with the same
tokens (else named missing, ``not_a_prefix``).

``opener=False`` (vLLM's ``add_generation_prompt: false`` alone): the
conversation as the template renders it with no generation prompt, the model
writing on after its last turn. Its ``system_end`` is the full prompt's, kept
as above; it has no opener, so no ``opener_start`` (not a missing mark).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ignis.gateway.capture_marks import MarkFinder, Marks
from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.continuation import continued_text
from ignis.gateway.messages import last_is_user
from ignis.gateway.output_parser import THINK_CLOSE, THINK_OPEN
from ignis.gateway.tokenizer import TextTokenizer

_finders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_finders_lock = threading.Lock()


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    ids: list[int]
    marks: Marks
    last_is_user: bool
    starts_in_reasoning: bool

    @property
    def system_end(self) -> int | None:
        return self.marks.system_end

    @property
    def opener_start(self) -> int | None:
        return self.marks.opener_start


def mark_finder(template: ChatTemplate, tok: TextTokenizer) -> MarkFinder:
    """The finder (and its cache) of this template and tokenizer."""
    with _finders_lock:
        finder = _finders.get(template)
        if finder is None or finder.tok is not tok:
            finder = _finders[template] = MarkFinder(template, tok)
        return finder


def _opens_think(opener: str) -> bool:
    """The generation opener leaves a ``<think>`` block open."""
    at = opener.rfind(THINK_OPEN)
    return at >= 0 and THINK_CLOSE not in opener[at:]


def build_chat_prompt(template: ChatTemplate, tok: TextTokenizer, messages: list[dict], tools: list[dict] | None,
                      extra: dict | None = None, continue_final: bool = False, opener: bool = True) -> ChatPrompt:
    """Raises ``TemplateRenderError`` when the template refuses the conversation."""
    if continue_final:
        return _continued(template, tok, messages, tools, extra)
    if not opener:
        return _bare(template, tok, messages, tools, extra)
    text = template.render(messages, tools, add_generation_prompt=True, extra=extra)
    ids = tok.encode(text)
    marks = mark_finder(template, tok).find(text, ids, messages, tools, extra)
    return ChatPrompt(text=text, ids=ids, marks=marks, last_is_user=last_is_user(messages),
                      starts_in_reasoning=_opens_think(marks.opener_text))


def _kept(mark: int | None, name: str, ids: list[int], head_ids: list[int], missing: list) -> int | None:
    """``mark`` (an index into ``head_ids``) where ``ids`` starts with the same tokens up to it."""
    if mark is None:
        return None
    if mark < len(ids) and ids[:mark] == head_ids[:mark]:
        return mark
    missing.append((name, "not_a_prefix"))
    return None


def _continued(template: ChatTemplate, tok: TextTokenizer, messages: list[dict], tools: list[dict] | None,
               extra: dict | None) -> ChatPrompt:
    text = continued_text(template, messages, tools, extra)
    ids = tok.encode(text)
    head = build_chat_prompt(template, tok, messages[:-1], tools, extra)
    missing = list(head.marks.missing)
    marks = Marks(_kept(head.system_end, "system_end", ids, head.ids, missing),
                  _kept(head.opener_start, "opener_start", ids, head.ids, missing), "", tuple(missing))
    return ChatPrompt(text=text, ids=ids, marks=marks, last_is_user=head.last_is_user,
                      starts_in_reasoning=_opens_think(text))


def _bare(template: ChatTemplate, tok: TextTokenizer, messages: list[dict], tools: list[dict] | None,
          extra: dict | None) -> ChatPrompt:
    text = template.render(messages, tools, add_generation_prompt=False, extra=extra)
    ids = tok.encode(text)
    full = build_chat_prompt(template, tok, messages, tools, extra)
    missing = list(full.marks.missing)
    system_end = _kept(full.system_end, "system_end", ids, full.ids, missing)
    missing = [m for m in missing if m[0] != "opener_start"]  # none asked for, none missing
    return ChatPrompt(text=text, ids=ids, marks=Marks(system_end, None, "", tuple(missing)),
                      last_is_user=full.last_is_user, starts_in_reasoning=False)
