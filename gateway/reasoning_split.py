"""Splits a streamed completion into reasoning and the text after it.

The model writes (``<think>`` and ``</think>`` are single tokens in the Qwen
vocabularies)::

    [<think>] reasoning </think> text

- A ``<think>`` counts only at the very start of the output (after
  whitespace), or when the prompt opened it (``starts_in_reasoning``); anywhere
  else it is text.
- Leading newlines of the reasoning and of the text after ``</think>`` are
  dropped. An unclosed ``<think>`` makes all the rest reasoning.
- A tail that may be the start of a marker is held back until the next push
  decides it; ``finish`` flushes.

``push`` and ``finish`` return ``(kind, text)`` events, kind "reasoning" or
"text", adjacent events of one kind merged. Pure Python.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


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

    def __init__(self, starts_in_reasoning: bool = False):
        self._state = "reasoning" if starts_in_reasoning else "start"
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
        self._emit(events, "reasoning" if self._state == "reasoning" else "text", buf)
        return events

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
            self._state = "text"
            return True
        if self._state == "reasoning":
            at = buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit(events, "reasoning", buf[:at])
                self._buf = buf[at + len(THINK_CLOSE):]
                self._state, self._strip_newlines = "text", True
                return True
            if not final:
                keep = partial_marker(buf, THINK_CLOSE)
                self._emit(events, "reasoning", buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
            return False
        if not final:  # text: all of it passes
            self._emit(events, "text", buf)
            self._buf = ""
        return False

    def _emit(self, events: list, kind: str, text: str) -> None:
        if self._strip_newlines:
            stripped = text.lstrip("\n")
            if not stripped:
                return
            text, self._strip_newlines = stripped, False
        add_event(events, kind, text)
