"""A Responses turn's output items, built from the chat path's deltas, with the stream events of each step.

    reasoning text  -> {"type": "reasoning", "id": "rs_...", "summary": [{"type": "summary_text", "text"}],
                        "encrypted_content"?: blob}
    content text    -> {"type": "message", "id": "msg_...", "role": "assistant", "status",
                        "content": [{"type": "output_text", "text", "annotations": []}]}
    a tool call     -> {"type": "function_call", "id": "fc_...", "call_id", "name", "namespace"?, "arguments",
                        "status"}

One item is open at a time; text of another kind closes it. Events of one
item, in order (``feed`` and ``close`` return them, without ``sequence_number``):

    reasoning  output_item.added, reasoning_summary_part.added, reasoning_summary_text.delta*,
               reasoning_summary_text.done, reasoning_summary_part.done, output_item.done
    message    output_item.added, content_part.added, output_text.delta*, output_text.done,
               content_part.done, output_item.done
    call       output_item.added, function_call_arguments.delta*, function_call_arguments.done,
               output_item.done

A cancelled run's open item is closed by ``cut``: a message ``incomplete``
with its text so far, a call ``incomplete`` unless its arguments are already
a whole JSON object and its closing tag came, reasoning with its text so
far. A call the output ended inside at ``max_output_tokens`` is
``incomplete`` too.

``parallel_tool_calls: false`` keeps the first call only. The turn as the
chat path takes it back (``assistant_turn``) uses the prompt's tool names.

With ``logprobs_of`` (the request asked for ``message.output_text.logprobs``),
each ``output_text.delta`` carries the logprobs of the delta's tokens whose
text became the message's (``TokenRecord.kind``; ``_content_runs`` says
where a token whose text came out later goes), and ``output_text.done`` and
the message's ``output_text`` part all of them: a token that wrote reasoning,
a call or a marker between them (``</think>``) reports none.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

from ignis.gateway.choice import ChoiceDelta, TokenRecord
from ignis.gateway.responses_tools import ToolNames


def _whole_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class OutputItems:
    def __init__(self, names: ToolNames, parallel_calls: bool = True, seal: Callable[[str], str] | None = None,
                 logprobs_of: Callable[[list[TokenRecord]], list[dict]] | None = None):
        self.names = names
        self.logprobs_of = logprobs_of
        self.lps: list[dict] = []  # of the open message
        self._held: list[TokenRecord] = []  # tokens whose text has not come out yet
        self._last_kind: str | None = None  # what the last token's text became
        self._cut_call: int | None = None  # the call the output ended inside (``ChoiceDelta.cut_call``)
        self.parallel_calls = parallel_calls
        self.seal = seal  # makes a reasoning item's encrypted_content, when asked for
        self.items: list[dict] = []
        self.kind: str | None = None  # of the open item: reasoning | message | call
        self._pieces: list[str] = []  # the open item's text
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict] = []  # chat tool calls, prompt names
        self.finish_reason: str | None = None

    # ----- events ----------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The open one's text so far."""
        return "".join(self._pieces)

    def _open(self, kind: str, item: dict) -> list[dict]:
        self.kind, self._pieces = kind, []
        self.items.append(item)
        events = [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item)}]
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if kind == "reasoning":
            events.append({"type": "response.reasoning_summary_part.added", **where, "summary_index": 0,
                           "part": {"type": "summary_text", "text": ""}})
        elif kind == "message":
            self.lps = []
            events.append({"type": "response.content_part.added", **where, "content_index": 0,
                           "part": self._part("")})
        return events

    def _delta(self, text: str) -> dict:
        self._pieces.append(text)  # joined once, at the close (no copy of the whole per delta)
        item, index = self.items[-1], len(self.items) - 1
        where = {"item_id": item["id"], "output_index": index}
        if self.kind == "reasoning":
            return {"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": text}
        if self.kind == "message":
            return {"type": "response.output_text.delta", **where, "content_index": 0, "delta": text, "logprobs": []}
        return {"type": "response.function_call_arguments.delta", **where, "delta": text}

    def close(self, status: str = "completed", call_status: str = "completed") -> list[dict]:
        """Close the open item (if any); its done events. ``status``: a message's, ``call_status``: a call's."""
        if self.kind is None:
            return []
        item, index, text = self.items[-1], len(self.items) - 1, self.text
        where = {"item_id": item["id"], "output_index": index}
        events: list[dict] = []
        if self.kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            if self.seal is not None:
                item["encrypted_content"] = self.seal(text)
            self.reasoning += text
            events += [{"type": "response.reasoning_summary_text.done", **where, "summary_index": 0, "text": text},
                       {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0, "part": part}]
        elif self.kind == "message":
            part = self._part(text)
            item.update(content=[part], status=status)
            self.content += text
            events += [{"type": "response.output_text.done", **where, "content_index": 0, "text": text,
                        "logprobs": list(self.lps)},
                       {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
        else:
            item.update(arguments=text, status=call_status)
            self.calls[-1]["function"]["arguments"] = text
            events.append({"type": "response.function_call_arguments.done", **where, "arguments": text,
                           "name": item["name"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": dict(item)})
        self.kind, self._pieces = None, []
        return events

    def snapshot(self) -> list[dict]:
        """The items as they stand (copies), the open one with its text so far."""
        out = [dict(i) for i in self.items]
        if self.kind is not None:
            item, text = out[-1], self.text
            if self.kind == "reasoning":
                item["summary"] = [{"type": "summary_text", "text": text}]
            elif self.kind == "message":
                item["content"] = [self._part(text)]
            else:
                item["arguments"] = text
        return out

    def cut(self) -> list[dict]:
        """Close the open item as generation stopped before its end (a cancel, a failure); its done events. A
        message is ``incomplete`` with its text so far; a call is ``completed`` when its arguments so far are
        a whole JSON object (no prefix of one is) and its closing tag came, else ``incomplete``; reasoning
        keeps its text so far."""
        if self.kind == "message":
            return self.close("incomplete")
        if self.kind == "call":
            whole = _whole_object(self.text) and not self._open_call_cut()
            return self.close(call_status="completed" if whole else "incomplete")
        return self.close()

    def _part(self, text: str) -> dict:
        part = {"type": "output_text", "text": text, "annotations": []}
        if self.logprobs_of is not None:
            part["logprobs"] = list(self.lps)
        return part

    def _switch(self, kind: str, item: dict) -> list[dict]:
        return self.close() + self._open(kind, item)

    # ----- deltas ----------------------------------------------------------------------

    def feed(self, d: ChoiceDelta) -> list[dict]:
        """The events of one delta of choice 0 (its pieces in the order the model wrote them)."""
        events: list[dict] = []
        runs = self._content_runs(d) if self.logprobs_of is not None else []
        pieces = d.in_order()
        last_content = max((i for i, (kind, _) in enumerate(pieces) if kind == "content"), default=-1)
        for i, (kind, value) in enumerate(pieces):
            if kind == "reasoning":
                if self.kind != "reasoning":
                    events += self._switch("reasoning", {"id": item_id("rs"), "type": "reasoning", "summary": []})
                events.append(self._delta(value))
            elif kind == "content":
                if self.kind != "message":
                    events += self._switch("message", {"id": item_id("msg"), "type": "message",
                                                       "status": "in_progress", "role": "assistant", "content": []})
                event = self._delta(value)
                # the n-th run of content tokens goes with the n-th content piece (the last takes any left)
                if i < last_content:
                    tokens = runs.pop(0) if runs else []
                else:
                    tokens, runs = [r for run in runs for r in run], []
                if tokens:
                    event["logprobs"] = self.logprobs_of(tokens)
                    self.lps += event["logprobs"]
                events.append(event)
            elif value.index == 0 or self.parallel_calls:
                events += self._call(value)
        if d.cut_call is not None:
            self._cut_call = d.cut_call
        if d.finish_reason:
            self.finish_reason = d.finish_reason
            cut = d.finish_reason == "length"
            events += self.close("incomplete" if cut else "completed",
                                 "incomplete" if cut and self._open_call_cut() else "completed")
        return events

    def _open_call_cut(self) -> bool:
        """The open item is the call the output ended inside (before its closing tag): incomplete, whatever
        its arguments so far parse to (the parser closes them)."""
        return self.kind == "call" and self._cut_call is not None and self._cut_call == len(self.calls) - 1

    def _content_runs(self, d: ChoiceDelta) -> list[list[TokenRecord]]:
        """The records of ``d``'s tokens whose text became content (``TokenRecord.kind``), in runs that a
        token of another kind breaks (one run per content piece of the delta). A token whose text came out
        later (kind None: held back as leading whitespace that could still open ``<think>``, the first piece
        of a marker) goes with the text that came out next, when that is content after content or after
        nothing; at a change of kind (``</think>`` and the newlines after it, a call's markers) it goes with
        none. Text that comes out with no token of its own (at the end) takes the tokens held."""
        runs: list[list[TokenRecord]] = [[]]
        for r in d.logprobs:
            if r.kind is None:
                self._held.append(r)
                continue
            held, self._held = self._held, []
            if r.kind == "content":
                runs[-1] += held if self._last_kind in (None, "content") else []
                runs[-1].append(r)
            elif runs[-1]:
                runs.append([])
            self._last_kind = r.kind
        if d.content and self._held and not any(runs) and self._last_kind in (None, "content"):
            runs, self._held = [self._held], []
        return [run for run in runs if run]

    def _call(self, piece) -> list[dict]:
        """The events of one piece of a call: its first names it and opens its item, the rest add arguments."""
        events: list[dict] = []
        if piece.id is not None:
            namespace, name = self.names.client_name(piece.name)
            item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": piece.id, "name": name, "arguments": ""}
            if namespace is not None:
                item["namespace"] = namespace
            events += self._switch("call", item)  # closes the call before, whose arguments ``close`` records
            self.calls.append({"id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": ""}})
        if piece.arguments:
            events.append(self._delta(piece.arguments))
        return events

    def assistant_turn(self) -> dict:
        """This output as a chat assistant message (for a stored conversation)."""
        turn: dict = {"role": "assistant", "content": self.content}
        if self.reasoning:
            turn["reasoning_content"] = self.reasoning
        if self.calls:
            turn["tool_calls"] = self.calls
        return turn
