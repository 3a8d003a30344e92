"""Capture marks for any chat template, found by rendering probe conversations once and cached.

    system block   lead + [user(PROBE_A)]  vs  lead + [user(PROBE_B)]         (generation prompt on)
                   longest common prefix (the tokens of A wholly inside the text both share),
                   cut back to the probe user turn's start; the block's text must tokenize alone
                   to exactly those tokens
    opener         [user(PROBE_A)] with vs without the generation prompt
                   where the two token sequences part, cut back to a turn start

``lead`` is the conversation's leading system messages. No probe holds the
conversation's history, so a template that raises on partial conversations
("No user query found"), re-renders earlier turns (reasoning stripped) or
puts tools inside the system turn is measured the same way.

The system block is cached by the JSON of (lead, tools, template kwargs),
the opener by the JSON of the template kwargs; one ``MarkFinder`` serves one
template and tokenizer. On a cached request a mark costs building that key,
one ``str.startswith`` / ``str.endswith`` on the prompt text and a few token
comparisons; no probe is rendered again. The opener check falls back to
rendering this conversation's history (without the generation prompt) when
the cached opener is not where the prompt ends.

A mark that cannot be found is reported in ``Marks.missing`` as
``(mark, reason)``, never dropped silently:

    probe_refused      the template raised on the probe conversations
    no_turn_boundary   the probes part nowhere near an added token that opens a turn
    not_a_prefix       what the probes found is not how this prompt starts (or, for the opener, ends)
    history_refused    the opener fallback: the template raised on the history alone
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from ignis.gateway.chat_template import ChatTemplate, TemplateRenderError
from ignis.gateway.tokenizer import TextTokenizer
from ignis.gateway.turn_boundaries import common_prefix_len, turn_start

PROBE_A = "Alpha probe question?"
PROBE_B = "Omega probe question?"
MAX_CACHED = 256
"""Distinct (system, tools, kwargs) blocks kept per template; the oldest goes first."""


def _key(value: object) -> bytes:
    """A cache key: a 16-byte BLAKE2b digest of the JSON of ``value`` (orjson; the standard library for
    what orjson refuses, such as integers past 64 bits). Not the JSON itself: an agent's system and
    tools block runs to tens of kilobytes, and the cache holds MAX_CACHED of them. A collision could
    only offer a wrong block, which the text and token checks of its use refuse."""
    try:
        raw = orjson.dumps(value)
    except orjson.JSONEncodeError:
        raw = json.dumps(value, default=repr).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass(frozen=True)
class Marks:
    """Token indices into the full prompt, and the marks that could not be found."""

    system_end: int | None
    opener_start: int | None
    opener_text: str
    missing: tuple[tuple[str, str], ...] = ()

    @property
    def missing_text(self) -> str | None:
        """``"system_end: not_a_prefix; ..."``, or None when nothing is missing."""
        return "; ".join(f"{mark}: {reason}" for mark, reason in self.missing) or None


@dataclass(frozen=True)
class _Span:
    """A run of prompt text that tokenizes on its own to ``ids`` (it ends right before a turn start,
    or starts with one)."""

    text: str
    ids: array  # int32: a cached block of a long system prompt keeps 4 bytes a token, not a tuple's ~36


@dataclass(frozen=True)
class _Missing:
    reason: str


class MarkFinder:
    """Finds ``system_end`` and ``opener_start`` in rendered prompts of one template and tokenizer."""

    def __init__(self, template: ChatTemplate, tok: TextTokenizer):
        self.template = template
        self.tok = tok
        self.added = frozenset(tok.added_content)
        self._blocks: dict[bytes, _Span | _Missing | None] = {}
        self._openers: dict[bytes, _Span | _Missing] = {}
        self._lock = threading.Lock()

    # ----- per request -------------------------------------------------------------

    def find(self, text: str, ids: Sequence[int], messages: list[dict], tools: list[dict] | None,
             extra: dict | None) -> Marks:
        """Marks of the prompt ``text`` / ``ids`` rendered (generation prompt on) from these inputs."""
        missing = []
        system_end = self._system_end(text, ids, messages, tools, extra, missing)
        opener_start, opener_text = self._opener_start(text, ids, messages, tools, extra, missing)
        if system_end is not None and opener_start is not None and system_end > opener_start:
            system_end = None
            missing.append(("system_end", "not_a_prefix"))
        return Marks(system_end, opener_start, opener_text, tuple(missing))

    def _system_end(self, text, ids, messages, tools, extra, missing) -> int | None:
        n_lead = 0
        while n_lead < len(messages) and messages[n_lead]["role"] == "system":
            n_lead += 1
        key = _key([messages[:n_lead], tools, extra])
        block = self._blocks.get(key)
        if block is None and key not in self._blocks:
            block = self._probe_block(messages[:n_lead], tools, extra)
            self._remember(self._blocks, key, block)
        if block is None:  # the template renders nothing before the first user turn
            return None
        if isinstance(block, _Missing):
            if n_lead or tools:
                missing.append(("system_end", block.reason))
            return None
        n = len(block.ids)
        if text.startswith(block.text) and len(ids) > n and ids[n - 1] == block.ids[-1] and ids[n] in self.added:
            return n
        missing.append(("system_end", "not_a_prefix"))
        return None

    def _opener_start(self, text, ids, messages, tools, extra, missing) -> tuple[int | None, str]:
        key = _key(extra)
        opener = self._openers.get(key)
        if opener is None:
            opener = self._probe_opener(extra)
            self._remember(self._openers, key, opener)
        if isinstance(opener, _Span):
            m = len(opener.ids)
            if len(ids) > m and text.endswith(opener.text) and array("i", ids[-m:]) == opener.ids:
                return len(ids) - m, opener.text
        return self._opener_from_history(text, ids, messages, tools, extra, missing)

    def _opener_from_history(self, text, ids, messages, tools, extra, missing) -> tuple[int | None, str]:
        try:
            history = self.template.render(messages, tools, add_generation_prompt=False, extra=extra)
        except TemplateRenderError:
            missing.append(("opener_start", "history_refused"))
            return None, ""
        start = self._parting_turn(list(ids), self.tok.encode(history), "assistant")
        if start is None or not 0 < start < len(ids):
            missing.append(("opener_start", "not_a_prefix"))
            return None, ""
        return start, self.tok.decode(ids[start:], skip_special_tokens=False)

    # ----- probes (once per key) ---------------------------------------------------

    def _probe_block(self, lead: list[dict], tools, extra) -> _Span | _Missing | None:
        try:
            a = self.template.render(lead + [{"role": "user", "content": PROBE_A}], tools, extra=extra)
            b = self.template.render(lead + [{"role": "user", "content": PROBE_B}], tools, extra=extra)
        except TemplateRenderError:
            return _Missing("probe_refused")
        enc = self.tok.tokenizer.encode(a, add_special_tokens=False)
        # the tokens of probe A that lie wholly inside the text both probes share
        shared = bisect.bisect_right([end for _, end in enc.offsets], common_prefix_len(a, b))
        start = turn_start(enc.ids, shared, self.added, self._names("user"))
        if start is None:
            return _Missing("no_turn_boundary")
        if start == 0:
            return None
        return self._span(a[:enc.offsets[start][0]], enc.ids[:start])

    def _probe_opener(self, extra) -> _Span | _Missing:
        probe = [{"role": "user", "content": PROBE_A}]
        try:
            full = self.template.render(probe, None, add_generation_prompt=True, extra=extra)
            history = self.template.render(probe, None, add_generation_prompt=False, extra=extra)
        except TemplateRenderError:
            return _Missing("probe_refused")
        enc = self.tok.tokenizer.encode(full, add_special_tokens=False)
        start = self._parting_turn(enc.ids, self.tok.encode(history), "assistant")
        if start is None:
            return _Missing("no_turn_boundary")
        return self._span(full[enc.offsets[start][0]:], enc.ids[start:])

    def _parting_turn(self, full: list[int], history: list[int], role: str) -> int | None:
        """Where the generation prompt's turn starts in ``full``: right where it parts from ``history``
        when an added token is there, else cut back to the turn start before it."""
        shared = common_prefix_len(full, history)
        if shared >= len(full):
            return None
        if full[shared] in self.added:
            return shared
        return turn_start(full, shared, self.added, self._names(role))

    def _span(self, text: str, ids: Sequence[int]) -> _Span | _Missing:
        if not ids or self.tok.encode(text) != list(ids):
            return _Missing("no_turn_boundary")
        return _Span(text, array("i", ids))

    def _names(self, role: str):
        def names_role(token_id: int) -> bool:
            return role in self.tok.token_text(token_id).casefold()
        return names_role

    def _remember(self, cache: dict, key: bytes, value) -> None:
        with self._lock:
            cache[key] = value
            while len(cache) > MAX_CACHED:
                cache.pop(next(iter(cache)))
