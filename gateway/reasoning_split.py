"""Splits a streamed completion into reasoning and the text after it.

The model writes (``<think>`` and ``</think>`` are single tokens in the Qwen
vocabularies)::

    [<think>] reasoning </think> text

- A ``<think>`` counts only at the very start of the output (after
  whitespace), or when the prompt opened it (``starts_in_reasoning``); anywhere
  else it is text. After a prompt that opened it, one the model writes again
  at the start is dropped (vLLM's qwen3 parser does so).
- Leading newlines of the reasoning and of the text after ``</think>`` are
  dropped. An unclosed ``<think>`` makes all the rest reasoning, except that
  with ``call_opener`` set (tool calls are parsed) a call opened inside the
  reasoning ends it: Qwen3.5 sometimes writes ``<tool_call>`` without closing
  ``</think>`` first. The opener counts only when what follows it (after
  whitespace) begins a call body, ``<function`` or ``{``, so reasoning that
  merely names the tag stays reasoning; the opener and the rest are text (a
  ``</think>`` that comes later is dropped).
- A tail that may be the start of a marker is held back until the next push
  decides it; ``finish`` flushes.

``push`` and ``finish`` return ``(kind, text)`` events, kind "reasoning" or
"text", adjacent events of one kind merged. Pure Python.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_BODIES = ("<function", "{")
"""How a call's body begins after its opener (qwen3_xml, hermes): an opener followed by one of them ends
reasoning that was never closed."""


def partial_marker(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


def add_event(events: list, kind: str, value: str) -> None:
    """Append ``(kind, value)``, merged into the last event when it is of the same kind."""
    if not value:
        return
    if events and events[-1][0] == kind:
        events[-1] = (kind, events[-1][1] + value)
    else:
        events.append((kind, value))


class ReasoningSplitter:
    """One choice's reasoning / text split; states ``start`` -> ``reasoning`` -> ``text``."""

    def __init__(self, starts_in_reasoning: bool = False, call_opener: str | None = None):
        self._state = "start"
        self._opened = starts_in_reasoning  # "start" decides between reasoning and a <think> written again
        self._call_opener = call_opener
        self._unclosed = False  # a call ended the reasoning before any </think>
        self._strip_newlines = starts_in_reasoning
        self._buf = ""

    def push(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        events: list[tuple[str, str]] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        while self._step(events, final=True):
            pass
        buf, self._buf = self._buf, ""
        self._emit(events, "reasoning" if self.in_reasoning else "text", buf)
        return events

    @property
    def in_reasoning(self) -> bool:
        """The next text is reasoning (unless it closes it): inside a thinking block, or at the start of one
        the prompt opened."""
        return self._state == "reasoning" or (self._state == "start" and self._opened)

    @property
    def decided(self) -> bool:
        """The reasoning is over (or never began): all the rest is text."""
        return self._state == "text"

    def _step(self, events: list, final: bool) -> bool:
        """Consume what the current state can decide; True when the state changed."""
        buf = self._buf
        if self._state == "start":
            head = buf.lstrip()
            if head.startswith(THINK_OPEN):
                self._buf = head[len(THINK_OPEN):]
                self._state, self._strip_newlines = "reasoning", True
                return True
            if not final and (not head or THINK_OPEN.startswith(head)):
                return False  # could still become <think>
            self._state = "reasoning" if self._opened else "text"
            return True
        if self._state == "reasoning":
            at = buf.find(THINK_CLOSE)
            call, held = self._call_start(buf if at < 0 else buf[:at], final)
            if call >= 0:  # a call opened inside the reasoning: the reasoning ends there
                self._emit(events, "reasoning", buf[:call])
                self._buf = buf[call:]
                self._state, self._strip_newlines, self._unclosed = "text", False, True
                return True
            if at >= 0:
                self._emit(events, "reasoning", buf[:at])
                self._buf = buf[at + len(THINK_CLOSE):]
                self._state, self._strip_newlines = "text", True
                return True
            if not final:
                keep = max(partial_marker(buf, THINK_CLOSE), held)
                self._emit(events, "reasoning", buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
            return False
        if self._unclosed:  # reasoning ended by a call: a late </think> is dropped, not text
            at = buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit(events, "text", buf[:at])
                self._buf, self._unclosed = buf[at + len(THINK_CLOSE):], False
                return True
            keep = 0 if final else partial_marker(buf, THINK_CLOSE)
            self._emit(events, "text", buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        if not final:  # text: all of it passes
            self._emit(events, "text", buf)
            self._buf = ""
        return False

    def _call_start(self, buf: str, final: bool) -> tuple[int, int]:
        """Where a call opener followed by a call body starts in ``buf`` (-1: none), and how long a tail
        to hold back because it may still become one (an opener, or one whose body has not shown yet)."""
        opener = self._call_opener
        if opener is None:
            return -1, 0
        at = buf.find(opener)
        while at >= 0:
            rest = buf[at + len(opener):].lstrip()
            if rest.startswith(CALL_BODIES):
                return at, 0
            if not final and any(body.startswith(rest) for body in CALL_BODIES):
                return -1, len(buf) - at  # the body may still come
            at = buf.find(opener, at + 1)
        return -1, 0 if final else partial_marker(buf, opener)

    def _emit(self, events: list, kind: str, text: str) -> None:
        if self._strip_newlines:
            stripped = text.lstrip("\n")
            if not stripped:
                return
            text, self._strip_newlines = stripped, False
        add_event(events, kind, text)
