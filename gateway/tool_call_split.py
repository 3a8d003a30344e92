"""Splits the text after reasoning into content and tool calls, as it streams.

    content <tool_call> body </tool_call> <tool_call> body </tool_call> ...

Each body goes to the format's block parser (``tool_call_format``); its
events become ``ToolCallDelta``: the first of a call carries its ``index``
(0, 1, ... per choice), a fresh ``id`` and the ``name``, the next ones
argument fragments that concatenate to the arguments JSON. A body that is not
a call in the model's format is tried in the other format once whole, and
otherwise returned as content as written, markers included. After the first
call, whitespace before another call or the end of the output is dropped.

``forced``: the prompt ended inside a call's opener (``tool_choice``
required or named), so the output starts in a block body; the opener is not
part of the output, so a body that fails is returned without it.

A hermes block's ``</tool_call>`` inside one of its JSON strings is that
string's text, not the block's end (a held call's string may hold it: the
grammar cannot keep it out of JSON). Markers are matched on text, so a tail that may be the start of one is held
back until the next push decides it; ``finish`` flushes (a block still open
then is decided as it stands, a parameter value cut off is dropped; after a
call, a block cut off before it names its function is dropped too, as vLLM's
parsers do, rather than returned as content the client would send back in
front of the calls). Pure Python.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ignis.gateway.reasoning_split import add_event, partial_marker
from ignis.gateway.tool_call_format import TOOL_CLOSE, TOOL_OPEN, block_parser, parse_other_format
from ignis.gateway.tool_call_xml import parameter_types


@dataclass(frozen=True)
class ForcedCall:
    """The prompt forces a call: of ``name``, or of any tool when None."""

    name: str | None = None


def forced_call(choice, tools) -> ForcedCall | None:
    """The call a ``tool_choice`` makes the prompt open (``required``: any tool, a named choice: that one),
    or None: no tools to call, or a choice that leaves the model free."""
    return ForcedCall(choice.name) if tools and choice.mode in ("required", "named") else None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call ``index``: its first piece has ``id`` and ``name``; ``arguments`` is a fragment."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_json(self) -> dict:
        """The OpenAI streaming form (``choices[i].delta.tool_calls[j]``)."""
        out: dict = {"index": self.index}
        fn: dict = {"arguments": self.arguments}
        if self.id is not None:
            out.update(id=self.id, type="function")
            fn = {"name": self.name, "arguments": self.arguments}
        out["function"] = fn
        return out


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def json_string_state(text: str, state: tuple[bool, bool] = (False, False)) -> tuple[bool, bool]:
    """(inside a JSON string, just after its escaping backslash) once ``text`` follows ``state``."""
    inside, escaped = state
    for ch in text:
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return inside, escaped


class ToolCallSplitter:
    """One choice's content / tool-call split. Events: ("content", text), ("tool_call", ToolCallDelta)."""

    def __init__(self, fmt: str, tools: list[dict] | None, forced: ForcedCall | None = None):
        self._fmt = fmt
        self._types = parameter_types(tools)
        self._buf = ""
        self._block = None
        self._body: list[str] = []  # the open block's text as written, in pieces
        self._json = (False, False)  # hermes: where the open block's text stands in a JSON string
        self._forced_open = False
        self._pending_ws = ""  # text after a call, held while it is only whitespace
        self.num_calls = 0
        self.cut_call: int | None = None  # the call the output ended inside (before its closing tag)
        if forced is not None:
            self._open_block(forced.name, forced_open=True)

    def push(self, text: str) -> list[tuple[str, object]]:
        self._buf += text
        events: list[tuple[str, object]] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[tuple[str, object]]:
        events: list[tuple[str, object]] = []
        buf, self._buf = self._buf, ""
        if self._block is not None:
            self._feed(events, buf)
            self._close_block(events, closed=False)
        else:
            self._content(events, buf)
        return events

    def _step(self, events: list) -> bool:
        """Consume what can be decided; True when a block opened or closed."""
        buf = self._buf
        if self._block is None:
            at = buf.find(TOOL_OPEN)
            if at >= 0:
                self._content(events, buf[:at])
                self._buf = buf[at + len(TOOL_OPEN):]
                self._open_block(None, forced_open=False)
                return True
            keep = partial_marker(buf, TOOL_OPEN)
            self._content(events, buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        at = buf.find(TOOL_CLOSE)
        if self._fmt == "hermes":  # a close inside one of the call's JSON strings is the string's text
            while at >= 0 and json_string_state(buf[:at], self._json)[0]:
                at = buf.find(TOOL_CLOSE, at + 1)
        if at >= 0:
            self._feed(events, buf[:at])
            self._buf = buf[at + len(TOOL_CLOSE):]
            self._close_block(events, closed=True)
            return True
        keep = partial_marker(buf, TOOL_CLOSE)
        self._feed(events, buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _open_block(self, forced_name: str | None, forced_open: bool) -> None:
        self._block = block_parser(self._fmt, self._types, forced_name)
        self._body = []
        self._json = (False, False)
        self._forced_open = forced_open

    def _feed(self, events: list, text: str) -> None:
        if text:
            self._body.append(text)
            if self._fmt == "hermes":
                self._json = json_string_state(text, self._json)
            self._calls(events, self._block.push(text))

    def _close_block(self, events: list, closed: bool) -> None:
        block, body = self._block, "".join(self._body)
        self._block, self._body = None, []
        rest = block.close(closed)
        if rest is None:
            other = parse_other_format(self._fmt, body, self._types)
            rest = [("header", other[0]), ("args", other[1])] if other is not None else None
        if rest is not None:
            self._calls(events, rest)
            if not closed:
                self.cut_call = self.num_calls - 1
            return
        if not closed and self.num_calls:
            self._pending_ws = ""  # the output ended inside another call's opener: a cut call, not content
            return
        self._content(events, ("" if self._forced_open else TOOL_OPEN) + body + (TOOL_CLOSE if closed else ""))

    def _calls(self, events: list, block_events: list[tuple[str, str]]) -> None:
        for kind, text in block_events:
            if kind == "header":
                self.num_calls += 1
                self._pending_ws = ""
                events.append(("tool_call", ToolCallDelta(self.num_calls - 1, new_tool_call_id(), text)))
            else:
                events.append(("tool_call", ToolCallDelta(self.num_calls - 1, arguments=text)))

    def _content(self, events: list, text: str) -> None:
        if self.num_calls:
            # After a call, trailing whitespace is held: dropped if a call or the end follows.
            text = self._pending_ws + text
            kept = text.rstrip()
            text, self._pending_ws = kept, text[len(kept):]
        add_event(events, "content", text)
