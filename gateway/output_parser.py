"""A chat choice's output parser: reasoning split off first, then tool calls out of the text after it.

    text ──> ReasoningSplitter ──reasoning──────────────────────────> ("reasoning", str)
                               └─text──> ToolCallSplitter ──content──> ("content", str)
                                         (tools on only)  └─calls────> ("tool_call", ToolCallDelta)

A tool call opened inside reasoning that was never closed ends the reasoning
(Qwen3.5 does this; ``reasoning_split``), so the call is parsed; a call after
a closed ``</think>`` is the usual case. With a forced call (``tool_choice``
required or named, see ``tool_call_format.forced_call_suffix``) the output
starts inside the call, so there is no reasoning to split. Pure Python.
"""

from __future__ import annotations

from ignis.gateway.reasoning_split import THINK_CLOSE, THINK_OPEN, ReasoningSplitter, add_event
from ignis.gateway.tool_call_format import TOOL_OPEN
from ignis.gateway.tool_call_split import ForcedCall, ToolCallDelta, ToolCallSplitter

__all__ = ["THINK_CLOSE", "THINK_OPEN", "ForcedCall", "OutputParser", "ToolCallDelta"]


class OutputParser:
    """``reasoning``: the vocabulary has think markers; ``tool_format``: "qwen3_xml" or "hermes" to parse
    tool calls of ``tools`` (None: no tool parsing); ``forced``: the prompt opened a call."""

    def __init__(self, *, reasoning: bool = True, starts_in_reasoning: bool = False, tool_format: str | None = None,
                 tools: list[dict] | None = None, forced: ForcedCall | None = None, max_calls: int | None = None):
        if forced is not None and tool_format is None:
            raise ValueError("a forced call needs a tool format")
        self.max_calls = max_calls  # later calls are left out (``parallel_tool_calls: false``: 1)
        self.reasoning = reasoning  # the vocabulary has think markers: usage counts reasoning tokens
        opener = TOOL_OPEN if tool_format is not None else None
        self._reasoning = (ReasoningSplitter(starts_in_reasoning, call_opener=opener)
                           if reasoning and forced is None else None)
        self._tools = ToolCallSplitter(tool_format, tools, forced) if tool_format is not None else None

    @property
    def num_tool_calls(self) -> int:
        return self._tools.num_calls if self._tools is not None else 0

    @property
    def cut_call(self) -> int | None:
        """The index of the call the output ended inside, before its closing tag (known after ``finish``)."""
        return self._tools.cut_call if self._tools is not None else None

    @property
    def in_reasoning(self) -> bool:
        """The next text is reasoning (``ReasoningSplitter.in_reasoning``)."""
        return self._reasoning is not None and self._reasoning.in_reasoning

    @property
    def past_reasoning(self) -> bool:
        """No text to come can be reasoning: the block is over, never began, or there is none to parse."""
        return self._reasoning is None or self._reasoning.decided

    @property
    def past_max_calls(self) -> bool:
        """A call past ``max_calls`` has started: the output the client gets is complete."""
        return self.max_calls is not None and self.num_tool_calls > self.max_calls

    def push(self, text: str) -> list[tuple[str, object]]:
        if self._reasoning is None:
            return self._kept(self._text(text))
        return self._kept(self._route(self._reasoning.push(text)))

    def finish(self) -> list[tuple[str, object]]:
        events = self._route(self._reasoning.finish()) if self._reasoning is not None else []
        if self._tools is not None:
            events += self._tools.finish()
        return self._kept(events)

    def _kept(self, events: list[tuple[str, object]]) -> list[tuple[str, object]]:
        """``events`` up to the first piece of a call past ``max_calls``: the output the client gets ends
        there (nothing written after it, text included)."""
        if self.max_calls is None or self.num_tool_calls <= self.max_calls:
            return events
        for i, (kind, value) in enumerate(events):
            if kind == "tool_call" and value.index >= self.max_calls:
                return events[:i]
        return []  # that call began in an earlier push

    def _route(self, split: list[tuple[str, str]]) -> list[tuple[str, object]]:
        events: list[tuple[str, object]] = []
        for kind, text in split:
            if kind == "reasoning":
                add_event(events, "reasoning", text)
            else:
                events += self._text(text)
        return events

    def _text(self, text: str) -> list[tuple[str, object]]:
        if self._tools is not None:
            return self._tools.push(text)
        return [("content", text)] if text else []
