"""Splits a chat completion's text into reasoning, content and tool calls, as it streams.

The model writes (markers are single tokens in the Qwen vocabularies)::

    [<think>] reasoning </think>  content  <tool_call>{"name": .., "arguments": {..}}</tool_call> ...

- Reasoning is the text between ``<think>`` and ``</think>``; a ``<think>``
  counts only at the very start of the output (after whitespace), or when the
  prompt itself opened it (``starts_in_reasoning``). Leading newlines of the
  reasoning and of the content after ``</think>`` are dropped. An unclosed
  ``<think>`` makes all the rest reasoning.
- With tool parsing on, each ``<tool_call>...</tool_call>`` block holding a JSON
  object with a string ``name`` (and ``arguments``, an object or a string)
  becomes a ``ToolCall``; a block that does not parse is passed on as content,
  markers included. Whitespace between and after tool calls is dropped.
- A text tail that may be the start of a marker is held back until the next
  delta decides it; ``finish`` flushes.

``push`` and ``finish`` return a list of ``(kind, value)`` events with kind
"reasoning", "content" (value: text) or "tool_call" (value: ``ToolCall``).
Pure Python.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is a JSON string, as OpenAI's API carries it."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_tool_call(body: str) -> ToolCall | None:
    """The call in one ``<tool_call>`` block, or None when it is not a well-formed call."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        arguments = args
    elif isinstance(args, dict):
        arguments = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return ToolCall(id=new_tool_call_id(), name=obj["name"], arguments=arguments)


def _partial(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


class OutputParser:
    """One choice's parser; see the module docstring."""

    def __init__(self, *, reasoning: bool = True, tools: bool = False, starts_in_reasoning: bool = False):
        self.reasoning = reasoning
        self.tools = tools
        self._state = "reasoning" if (reasoning and starts_in_reasoning) else ("start" if reasoning else "content")
        self._strip_newlines = self._state == "reasoning"
        self._buf = ""
        self._pending_ws = ""  # text after a tool call, held while it is only whitespace
        self.num_tool_calls = 0

    def push(self, text: str) -> list[tuple[str, object]]:
        self._buf += text
        events: list[tuple[str, object]] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[tuple[str, object]]:
        events: list[tuple[str, object]] = []
        while self._step(events, final=True):
            pass
        buf, self._buf = self._buf, ""
        if self._state == "tool_call":
            call = parse_tool_call(buf)
            if call is not None:
                self._call(events, call)
            else:
                self._content(events, TOOL_OPEN + buf)
        elif self._state == "reasoning":
            self._emit(events, "reasoning", buf)
        elif buf:
            self._content(events, buf)
        return events

    # ----- states -------------------------------------------------------------------

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
            self._state = "content"
            return True
        if self._state == "reasoning":
            at = buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit(events, "reasoning", buf[:at])
                self._buf = buf[at + len(THINK_CLOSE):]
                self._state, self._strip_newlines = "content", True
                return True
            keep = 0 if final else _partial(buf, THINK_CLOSE)
            if not final:
                self._emit(events, "reasoning", buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
            return False
        if self._state == "content":
            at = buf.find(TOOL_OPEN) if self.tools else -1
            if at >= 0:
                self._content(events, buf[:at])
                self._buf = buf[at + len(TOOL_OPEN):]
                self._state = "tool_call"
                return True
            keep = _partial(buf, TOOL_OPEN) if self.tools and not final else 0
            if not final:
                self._content(events, buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
            return False
        # tool_call
        at = buf.find(TOOL_CLOSE)
        if at < 0:
            return False
        body, self._buf = buf[:at], buf[at + len(TOOL_CLOSE):]
        call = parse_tool_call(body)
        if call is None:
            self._content(events, TOOL_OPEN + body + TOOL_CLOSE)
        else:
            self._call(events, call)
        self._state = "content"
        return True

    def _call(self, events: list, call: ToolCall) -> None:
        self.num_tool_calls += 1
        self._pending_ws = ""
        events.append(("tool_call", call))

    def _content(self, events: list, text: str) -> None:
        if self.num_tool_calls:
            # After a call, whitespace-only text is dropped; other text is kept (with its whitespace).
            self._pending_ws += text
            if not self._pending_ws.strip():
                return
            text, self._pending_ws = self._pending_ws, ""
        self._emit(events, "content", text)

    def _emit(self, events: list, kind: str, text: str) -> None:
        if self._strip_newlines:
            stripped = text.lstrip("\n")
            if not stripped:
                return
            text, self._strip_newlines = stripped, False
        if not text:
            return
        if events and events[-1][0] == kind:
            events[-1] = (kind, events[-1][1] + text)
        else:
            events.append((kind, text))
