"""Chat messages, tools and tool_choice: checked, normalized for the template, developer policy applied.

Each message becomes a plain dict the chat template reads: ``role``, ``content``
(a string, a list of text and image parts, or absent for an assistant turn that
only calls tools; an image part is ``{"type": "image_url", "image_url": {"url": ...}}``
whichever of OpenAI's forms it came in, and video parts are refused: not supported yet) and, where given, ``name``, ``tool_calls`` (their string
``arguments`` parsed into objects, as vLLM does, so templates may iterate them),
``tool_call_id`` and ``reasoning_content``.

Developer messages (``apply_developer_policy``):

    in-place       each developer message is rendered where it stands: a system turn there, or, when
                   the template takes a system turn only first, a user turn reading
                   DEVELOPER_TURN_PREFIX + its text (first in the conversation it stays a system turn)
    into-system    their text is appended to the leading system message (one is created if none)
    after-system   they move right after the leading system message: system turns, or the user turns
                   in-place makes where the template takes a system turn only first

Tool-call ``arguments`` must be strings holding JSON objects (as OpenAI's API
sends them) or objects (as vLLM takes them); ``check_tool_results`` refuses a tool message that answers no
earlier call.

Tools go to the template unchanged, whatever the ``tool_choice``, as vLLM
does (``prompt_tools``; ``--exclude-tools-when-tool-choice-none`` withholds
them under "none"). "none" turns tool-call parsing off; required and named
calls are forced by the chat handler, which ends the prompt with the call's
opener.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignis.gateway import strict_json
from ignis.gateway.errors import invalid
from ignis.gateway.fields import Fields

ROLES = ("system", "developer", "user", "assistant", "tool")
VIDEO_PARTS = ("video_url", "video", "input_video")
DEVELOPER_TURN_PREFIX = "Developer instructions:\n"
"""Opens the user turn an ``in-place`` developer message becomes where the template refuses a late system turn."""
MAX_MESSAGES = 100_000


def text_of(content: object) -> str:
    """The text of a content value (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _content(f: Fields, role: str) -> object:
    value = f.raw("content")
    if value is None:
        if role == "assistant":
            return None
        raise f.error("content", "is required")
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise f.error("content", "must be a string or an array of content parts")
    for j, part in enumerate(value):
        pf = Fields(part, f.param(f"content[{j}]"))
        kind = pf.str("type")
        if kind == "image_url":
            value[j] = _image_part(pf)
            continue
        if kind in VIDEO_PARTS:
            raise pf.error("type", "video inputs are not supported yet")
        if kind != "text":
            raise pf.error("type", f"only text and image_url content parts are supported, got {kind!r}")
        if type(pf.raw("text")) is not str:
            raise pf.error("text", "must be a string")
        # as the template reads it: other keys (``image_url: null`` from SDKs that send every field) would
        # make a template that asks ``'image_url' in item`` render an image where the text is
        value[j] = {"type": "text", "text": pf.raw("text")}
    return value


def _image_part(pf: Fields) -> dict:
    """An ``image_url`` part as the template reads it: ``image_url`` an object holding ``url``."""
    ref = pf.raw("image_url")
    if isinstance(ref, str):
        url = ref
    elif isinstance(ref, dict):
        url = Fields(ref, pf.param("image_url")).str("url", max_chars=1 << 30)
    else:
        raise pf.error("image_url", "must be an object holding the image's url")
    if not url:
        raise pf.error("image_url", "needs a url (a data: URL or an http(s) URL)")
    return {"type": "image_url", "image_url": {"url": url}}


def image_urls(messages: list[dict]) -> list[str]:
    """The URLs of the image parts of ``messages``, in the order the template renders them."""
    return [part["image_url"]["url"] for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


def read_arguments(f: Fields, text: str) -> dict:
    """A call's ``arguments`` string as a request holds it, read: strict JSON (gateway.strict_json; no lone
    surrogate), an object; blank is ``{}``. Anything else is a 400 naming ``f``'s ``arguments``."""
    try:
        parsed = strict_json.loads(text, finite=False) if text.strip() else {}
    except ValueError as e:
        raise f.error("arguments", f"must be a JSON object encoded as a string; it is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise f.error("arguments", "must encode a JSON object")
    return parsed


def _tool_calls(f: Fields) -> list[dict]:
    calls = f.list("tool_calls") or []
    out = []
    for j, call in enumerate(calls):
        cf = Fields(call, f.param(f"tool_calls[{j}]"))
        cf.str("type", "function", choices=("function",))
        fn = cf.object("function")
        if fn is None:
            raise cf.error("function", "is required")
        name = fn.str("name")
        if not name:
            raise fn.error("name", "is required")
        args = fn.raw("arguments")
        if isinstance(args, dict):
            args = dict(args)  # an object as it is (vLLM takes it so too)
        elif not isinstance(args, str):
            raise fn.error("arguments", "must be a string holding a JSON object (as OpenAI's API sends it) or an "
                                        f"object, got {type(args).__name__ if args is not None else 'null'}")
        else:
            args = read_arguments(fn, args)
        entry = {"type": "function", "function": {"name": name, "arguments": args}}
        if cf.has("id"):
            entry["id"] = cf.str("id", max_chars=256)
        out.append(entry)
    return out


def parse_messages(f: Fields) -> list[dict]:
    messages = f.list("messages", required=True, max_items=MAX_MESSAGES)
    if not messages:
        raise f.error("messages", "must hold at least one message")
    out = []
    for i, message in enumerate(messages):
        mf = Fields(message, f"messages[{i}]")
        role = mf.str("role")
        if role is None:
            raise mf.error("role", "is required")
        if role not in ROLES:
            raise mf.error("role", f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
        m: dict = {"role": role}
        content = _content(mf, role)
        if content is not None:
            m["content"] = content
        if mf.has("name"):
            m["name"] = mf.str("name", max_chars=256)
        if role == "assistant":
            calls = _tool_calls(mf)
            if calls:
                m["tool_calls"] = calls
            reasoning = mf.str("reasoning_content") if mf.has("reasoning_content") else mf.str("reasoning")
            if reasoning is not None:
                m["reasoning_content"] = reasoning
            if content is None and not calls:
                m["content"] = ""
        if role == "tool" and mf.has("tool_call_id"):
            m["tool_call_id"] = mf.str("tool_call_id", max_chars=256)
        out.append(m)
    return out


def check_tool_results(messages: list[dict]) -> None:
    """Each tool message answers a call of an earlier assistant message: 400 otherwise.

    A ``tool_call_id`` must name one of those calls when they carry ids; a tool
    message with no earlier call at all is refused whatever its id.
    """
    ids: set[str] = set()
    anonymous = False  # an earlier call without an id: any tool_call_id may answer it
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            for call in m.get("tool_calls", ()):
                if call.get("id") is not None:
                    ids.add(call["id"])
                else:
                    anonymous = True
        elif m["role"] == "tool":
            if not ids and not anonymous:
                raise invalid(f"messages[{i}] is a tool result, but no earlier assistant message calls a tool",
                              f"messages[{i}]")
            call_id = m.get("tool_call_id")
            if call_id is not None and call_id not in ids and not anonymous:
                raise invalid(f"messages[{i}].tool_call_id {call_id!r} matches no tool call of an earlier "
                              f"assistant message", f"messages[{i}].tool_call_id")


def _developer_turn(message: dict, first: bool, late_system: bool) -> dict:
    if first or late_system:
        return dict(message, role="system")
    return dict(message, role="user", content=DEVELOPER_TURN_PREFIX + text_of(message.get("content")))


def apply_developer_policy(messages: list[dict], policy: str, late_system: bool = True) -> list[dict]:
    """Messages with developer turns placed by ``policy`` (see the module docstring); ``late_system``
    says the template renders a system turn after the first message."""
    if policy == "in-place":
        return [_developer_turn(m, i == 0, late_system) if m["role"] == "developer" else m
                for i, m in enumerate(messages)]
    devs = [m for m in messages if m["role"] == "developer"]
    if not devs:
        return messages
    rest = [m for m in messages if m["role"] != "developer"]
    has_system = bool(rest) and rest[0]["role"] == "system"
    if policy == "into-system":
        parts = ([text_of(rest[0].get("content"))] if has_system else []) + [text_of(m.get("content")) for m in devs]
        system = dict(rest[0]) if has_system else {"role": "system"}
        system["content"] = "\n\n".join(p for p in parts if p)
        return [system] + rest[1 if has_system else 0:]
    if policy == "after-system":
        first = 1 if has_system else 0
        moved = [_developer_turn(m, first + j == 0, late_system) for j, m in enumerate(devs)]
        return rest[:first] + moved + rest[first:]
    raise ValueError(f"unknown developer message policy {policy!r}")


def breaks_call_markup(name: str) -> bool:
    """Whether a tool name holds what would end the call's markup the model writes it in (whitespace, '<',
    '>', an unprintable character): such a name is a 400 on every API that takes tools."""
    return any(c.isspace() or c in "<>" or not c.isprintable() for c in name)


def parse_tools(f: Fields) -> list[dict] | None:
    tools = f.list("tools")
    if not tools:
        return None
    for i, tool in enumerate(tools):
        tf = Fields(tool, f"tools[{i}]")
        tf.str("type", "function", choices=("function",))
        fn = tf.object("function")
        if fn is None:
            raise tf.error("function", "is required")
        name = fn.str("name", max_chars=256)
        if not name:
            raise fn.error("name", "is required")
        if breaks_call_markup(name):
            # the model writes the name inside the call's markup (<function=NAME>, <tool_call>): such a name
            # could end it early, and a required call held to it could never be parsed as a call
            raise fn.error("name", f"{name[:64]!r} holds whitespace, '<' or '>' (a name is written inside the "
                                   "call's markup); OpenAI's names are [a-zA-Z0-9_-]")
        fn.str("description")
        fn.object("parameters")
    return tools


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # none | auto | required | named
    name: str | None = None
    allowed: tuple[str, ...] | None = None
    """OpenAI's ``allowed_tools``: the functions a call may name (None: every tool)."""


def parse_tool_choice(f: Fields, tools: list[dict] | None) -> ToolChoice:
    value = f.raw("tool_choice")
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise f.error("tool_choice", "must be 'none', 'auto', 'required', a named function or allowed_tools")
        if value == "required" and not tools:
            raise f.error("tool_choice", "'required' needs tools")
        return ToolChoice(value)
    cf = Fields(value, "tool_choice")
    known = {t["function"]["name"] for t in tools or ()}
    if cf.str("type", "function", choices=("function", "allowed_tools")) == "allowed_tools":
        return _allowed_tools(cf, known)
    fn = cf.object("function")
    name = fn.str("name") if fn is not None else None
    if not name:
        raise invalid("tool_choice.function.name is required", "tool_choice.function.name")
    if name not in known:
        raise invalid(f"tool_choice names function {name!r}, which is not in tools", "tool_choice.function.name")
    return ToolChoice("named", name)


def prompt_tools(tools: list[dict] | None, choice: ToolChoice, exclude_when_none: bool) -> list[dict] | None:
    """The tools the template renders: all of them, unless the choice is none and ``exclude_when_none``."""
    return None if choice.mode == "none" and exclude_when_none else tools


def _allowed_tools(cf: Fields, known: set[str]) -> ToolChoice:
    """``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [{"type":
    "function", "function": {"name"}}, ...]}}``: calls name only the listed functions; every tool stays in
    the prompt."""
    spec = cf.object("allowed_tools")
    if spec is None:
        raise cf.error("allowed_tools", "is required")
    mode = spec.str("mode", None, choices=("auto", "required"))
    if mode is None:
        raise spec.error("mode", "is required: 'auto' or 'required'")
    entries = spec.list("tools")
    if not entries:
        raise spec.error("tools", "must list at least one function")
    names: list[str] = []
    for i, entry in enumerate(entries):
        ef = Fields(entry, spec.param(f"tools[{i}]"))
        ef.str("type", "function", choices=("function",))
        fn = ef.object("function")
        name = fn.str("name") if fn is not None else None
        if not name:
            raise ef.error("function.name", "is required")
        if name not in known:
            raise ef.error("function.name", f"names function {name!r}, which is not in tools")
        names.append(name)
    return ToolChoice(mode, allowed=tuple(dict.fromkeys(names)))


def last_is_user(messages: list[dict]) -> bool:
    """The last message is a real user turn (not a tool result, nor one wrapped as a user turn)."""
    if not messages or messages[-1]["role"] != "user":
        return False
    text = text_of(messages[-1].get("content")).strip()
    return not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))
