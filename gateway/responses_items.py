"""Responses ``input`` items as the chat messages the chat path renders.

    {"type": "message", "role": system|developer|user, "content": str | parts}
                                   -> {"role", "content": str | [{"type": "text", "text"}]}
    {"type": "message", "role": "assistant", "content": [output_text | refusal parts]}
    {"type": "reasoning", "summary": [summary_text], "content": [reasoning_text], "encrypted_content"}
    {"type": "function_call", "call_id", "name", "namespace"?, "arguments"}
                                   -> one assistant turn: {"role": "assistant", "content",
                                      "reasoning_content", "tool_calls": [{"id": call_id, ...}]}
    {"type": "function_call_output", "call_id", "output": str | parts}
                                   -> {"role": "tool", "tool_call_id": call_id, "content": str}

A message item may leave out ``type`` (OpenAI's "easy" input message); a
string ``input`` is one user message. A run of assistant-side items (reasoning,
an assistant message, function calls) is one assistant turn, the reasoning
given to it as ``reasoning_content``: a reasoning blob (``encrypted_content``,
gateway.reasoning_seal) is opened to the reasoning text it carries (a blob
this install did not seal is a 400 naming it); without one, the summary or
content text is used. Reasoning followed by a user, system or tool item
rather than an assistant one (an output cut while it still reasoned) is an
assistant turn of its own with empty content, as ``previous_response_id``
stores that output; reasoning that ends the input is dropped.
Parts: ``input_text``, ``output_text``, ``text`` and ``refusal`` are text;
``input_image`` (its ``image_url``, in a user message) becomes a chat
``image_url`` part, read as the chat path reads images; ``input_file`` and
``input_audio`` are a 400. Any other item type is a 400 naming
``input[i].type``. ``instructions`` takes the same forms: a string is one
system message, an array is items (not carried over by previous_response_id). Each message remembers the field it came from
(``origins``), so a later 400 of the chat path names the Responses field.

``listed_items`` gives the same ``input`` as OpenAI lists it afterwards
(``GET /v1/responses/{id}/input_items``): normalized items, each with an id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields
from ignis.gateway.messages import read_arguments
from ignis.gateway.reasoning_seal import ReasoningSeal, SealError
from ignis.gateway.responses_output import item_id
from ignis.gateway.responses_tools import ToolNames

MAX_ITEMS = 100_000
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
ROLES = ("system", "developer", "user", "assistant")


@dataclass
class Conversation:
    messages: list[dict] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    call_ids: set[str] = field(default_factory=set)

    def add(self, message: dict, origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)


def _parts_text(f: Fields, name: str, as_parts: bool, images: bool = False) -> object:
    """A content value as a string, or a list of chat text parts (``as_parts``); ``images``: an
    ``input_image`` part becomes a chat ``image_url`` part (a user message's content)."""
    value = f.raw(name)
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise f.error(name, "must be a string or an array of content parts")
    parts: list = []
    for j, part in enumerate(value):
        pf = Fields(part, f.param(f"{name}[{j}]"))
        kind = pf.str("type")
        if kind == "input_image" and images:
            parts.append(_image_part(pf))
            continue
        if kind in TEXT_PARTS:
            text = pf.str("text")
        elif kind == "refusal":
            text = pf.str("refusal")
        elif kind == "input_image":
            raise pf.error("type", "input_image parts are taken in user messages only")
        elif kind in ("input_file", "input_audio"):
            raise pf.error("type", f"{kind} parts are not supported")
        else:
            raise pf.error("type", f"unknown content part type {kind!r}")
        if text is None:
            raise pf.error("refusal" if kind == "refusal" else "text", "is required")
        parts.append(text)
    if as_parts:
        return [t if isinstance(t, dict) else {"type": "text", "text": t} for t in parts]
    return "".join(parts)


def _image_part(pf: Fields) -> dict:
    """An ``input_image`` part (its ``image_url``: a data: URL or an http(s) URL) as a chat ``image_url`` part."""
    url = pf.str("image_url", max_chars=1 << 30)
    if not url:
        which = "file_id images are not supported; send" if pf.has("file_id") else "needs"
        raise pf.error("image_url", f"{which} an image_url (a data: URL or an http(s) URL)")
    return {"type": "image_url", "image_url": {"url": url}}


def _reasoning_text(f: Fields, seal: ReasoningSeal) -> str:
    blob = f.raw("encrypted_content")
    if blob is not None:
        if not isinstance(blob, str):
            raise f.error("encrypted_content", "must be a string")
        try:
            return seal.open(blob)
        except SealError as e:
            raise f.error("encrypted_content", f"{e}") from None
    for name in ("content", "summary"):
        if f.list(name):
            return "\n\n".join(p["text"] for p in _parts_text(f, name, True) if p["text"])
    return ""


def _arguments(f: Fields) -> str:
    args = f.raw("arguments")
    if not isinstance(args, str):
        raise f.error("arguments", "must be a string holding a JSON object")
    read_arguments(f, args)
    return args if args.strip() else "{}"


class _Builder:
    def __init__(self, conv: Conversation, names: ToolNames, seal: ReasoningSeal):
        self.conv, self.names, self.seal = conv, names, seal
        self.turn: dict | None = None  # the assistant turn items are being added to
        self.reasoning: list[str] = []

    def assistant(self, origin: str, content: str | None = None) -> dict:
        if self.turn is None or content is not None:
            self.turn = {"role": "assistant", "content": content or ""}
            self.conv.add(self.turn, origin)
        if self.reasoning:
            text = "\n\n".join(self.reasoning)
            prior = self.turn.get("reasoning_content")
            self.turn["reasoning_content"] = f"{prior}\n\n{text}" if prior else text
            self.reasoning = []
        return self.turn

    def other(self, message: dict, origin: str) -> None:
        self.flush(origin)
        self.turn = None
        self.conv.add(message, origin)

    def flush(self, origin: str) -> None:
        """Reasoning not yet given to a turn is an assistant turn of its own (an output cut while it still
        reasoned: ``previous_response_id`` keeps that turn, so a resent history must too)."""
        if self.reasoning:
            self.assistant(origin)

    def item(self, f: Fields) -> None:
        kind = f.str("type", "message")
        if kind == "message":
            role = f.str("role")
            if role is None:
                raise f.error("role", "is required")
            if role not in ROLES:
                raise f.error("role", f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
            if f.raw("content") is None:
                raise f.error("content", "is required")
            if role == "assistant":
                self.assistant(f.where, _parts_text(f, "content", False))
            else:
                self.other({"role": role, "content": _parts_text(f, "content", True, images=role == "user")},
                           f.where)
        elif kind == "reasoning":
            text = _reasoning_text(f, self.seal)
            if text:
                self.reasoning.append(text)
        elif kind == "function_call":
            call_id, name = f.str("call_id", max_chars=256), f.str("name", max_chars=256)
            if not call_id:
                raise f.error("call_id", "is required")
            if not name:
                raise f.error("name", "is required")
            flat = self.names.flat(name, f.str("namespace", max_chars=64))
            turn = self.assistant(f.where)
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": flat, "arguments": _arguments(f)}})
            self.conv.call_ids.add(call_id)
        elif kind == "function_call_output":
            call_id = f.str("call_id", max_chars=256)
            if not call_id:
                raise f.error("call_id", "is required")
            if call_id not in self.conv.call_ids:
                raise f.error("call_id", f"{call_id!r} answers no earlier function_call item")
            if f.raw("output") is None:
                raise f.error("output", "is required")
            self.other({"role": "tool", "tool_call_id": call_id, "content": _parts_text(f, "output", False)},
                       f.where)
        else:
            raise f.error("type", f"unknown or unsupported input item type {kind!r} (supported: message, "
                                  "reasoning, function_call, function_call_output)")


def translate_input(f: Fields, names: ToolNames, seal: ReasoningSeal, earlier: Conversation) -> Conversation:
    """``earlier`` (a stored conversation, or empty) followed by the body's ``input``."""
    conv = Conversation(list(earlier.messages), list(earlier.origins), set(earlier.call_ids))
    if f.raw("input") is None:
        raise f.error("input", "is required")
    _add_items(f, "input", "user", conv, names, seal)
    return conv


def translate_instructions(f: Fields, names: ToolNames, seal: ReasoningSeal) -> Conversation:
    """The body's ``instructions``: a string is one system message; an array is message items, as in ``input``."""
    conv = Conversation()
    value = f.raw("instructions")
    if value is not None and value != "":
        _add_items(f, "instructions", "system", conv, names, seal)
    return conv


def _add_items(f: Fields, key: str, string_role: str, conv: Conversation, names: ToolNames,
               seal: ReasoningSeal) -> None:
    """The items of field ``key`` (a string: one ``string_role`` message) appended to ``conv``."""
    value = f.raw(key)
    if isinstance(value, str):
        conv.add({"role": string_role, "content": value}, key)
        return
    if not isinstance(value, list):
        raise f.error(key, "must be a string or an array of items")
    items = f.list(key, max_items=MAX_ITEMS)
    builder = _Builder(conv, names, seal)
    for i, item in enumerate(items):
        builder.item(Fields(item, f"{key}[{i}]"))


def stored_call_ids(messages) -> set[str]:
    return {c["id"] for m in messages for c in m.get("tool_calls", ()) if c.get("id")}


# ----- the input items as listed (GET /v1/responses/{id}/input_items) ---------------------

def listed_items(value: object, taken: set[str]) -> list[dict]:
    """The body's ``input`` (already checked by ``translate_input``) as OpenAI lists a response's input
    items, each with an ``id`` (the client's, else a new one). An id already in ``taken`` (an item of the
    ``previous_response_id`` chain sent again) or given twice is a 400, as OpenAI answers it: the item would
    be in the prompt twice.

        a string                        {"type": "message", "role": "user", "content": [input_text], "status"}
        message (system/developer/user) content as input parts (a string: one input_text part)
        message (assistant)             content as output parts (output_text with annotations, refusal)
        reasoning                       summary as summary_text parts (content, encrypted_content as sent)
        function_call                   call_id, name, namespace?, arguments, status
        function_call_output            call_id, output, status
    """
    raw = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
    out = []
    for i, item in enumerate(raw):
        listed = _listed(item)
        given = item.get("id")
        if isinstance(given, str) and given in taken:
            raise invalid(f"Duplicate item found with id {given}. Remove duplicate items from your input and try "
                          f"again (an item of the previous_response_id chain is in the prompt already).",
                          "input" if isinstance(value, str) else f"input[{i}].id")
        listed = {"id": given if isinstance(given, str) and given else item_id(_ID_PREFIX[listed["type"]]), **listed}
        taken.add(listed["id"])
        out.append(listed)
    return out


_ID_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc", "function_call_output": "fco"}


def _listed(item: dict) -> dict:
    kind = item.get("type") or "message"
    if kind == "message":
        role, content = item["role"], item["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        listed = [_output_part(p) if role == "assistant" else _input_part(p) for p in parts]
        return {"type": "message", "role": role, "content": listed, "status": "completed"}
    if kind == "reasoning":
        out: dict = {"type": "reasoning", "summary": [{"type": "summary_text", "text": p.get("text", "")}
                                                      for p in item.get("summary") or ()]}
        if item.get("content"):
            out["content"] = [{"type": "reasoning_text", "text": p.get("text", "")} for p in item["content"]]
        if item.get("encrypted_content") is not None:
            out["encrypted_content"] = item["encrypted_content"]
        return out
    if kind == "function_call":
        out = {"type": "function_call", "call_id": item["call_id"], "name": item["name"],
               "arguments": item["arguments"] if item["arguments"].strip() else "{}", "status": "completed"}
        if item.get("namespace"):
            out["namespace"] = item["namespace"]
        return out
    return {"type": "function_call_output", "call_id": item["call_id"], "output": item["output"],
            "status": "completed"}


def _input_part(part: dict) -> dict:
    kind = part.get("type")
    if kind == "input_image":
        return {"type": "input_image", "image_url": part.get("image_url"), "detail": part.get("detail") or "auto"}
    return {"type": "input_text", "text": part["refusal"] if kind == "refusal" else part.get("text", "")}


def _output_part(part: dict) -> dict:
    if part.get("type") == "refusal":
        return {"type": "refusal", "refusal": part.get("refusal", "")}
    return {"type": "output_text", "text": part.get("text", ""), "annotations": part.get("annotations") or []}
