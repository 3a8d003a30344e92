"""The hermes tool-call format (Qwen3, Qwen3-Next): a JSON object inside each ``<tool_call>`` block.

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

A block is decided when it ends: a JSON object (read strictly:
``gateway.strict_json``, so no NaN, Infinity or lone surrogate) with a non-empty string
``name`` and ``arguments`` (or ``parameters``) that is an object, or a string
holding one, is a call; anything else is not (``close`` returns None, and the
caller shows it as content), except that a body the output ended inside
whose ``"name"`` is written whole and is one of the request's tools is that
call with ``{}`` (cut by ``max_tokens``: as an XML call stands once its name
is out). A call's events are its header, then its
arguments as one fragment: an object re-serialized (``json.dumps``, non-ASCII
kept), a string holding one passed on as written.

A forced call (the prompt ends with ``hermes_opener(name)``) starts with that
opener's text as the body: the model continues the arguments. When what it
wrote does not parse, the named call still stands, with ``{}``. Pure Python.
"""

from __future__ import annotations

import json
import re

from ignis.gateway import strict_json


def hermes_opener(name: str | None) -> str:
    """What the prompt ends with to force a call of ``name`` (any call when None), after ``<tool_call>``."""
    return "\n" if name is None else "\n" + _call_prefix(name)


def _call_prefix(name: str) -> str:
    # No space after the colon: Qwen's vocabulary writes it as part of the next token (' {"'), so a
    # prompt ending in a lone space would be one the model never saw.
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'


def parse_hermes_block(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of a whole block body, or None when it is not a well-formed call."""
    try:
        obj = strict_json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            decoded = strict_json.loads(args) if args.strip() else {}
        except ValueError:
            return None
        if not isinstance(decoded, dict):
            return None
        return obj["name"], json.dumps(decoded, ensure_ascii=False) if not args.strip() else args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


_CUT_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')


class HermesCallBlock:
    """One ``<tool_call>`` body, decided at ``close``. Events: ("header", name), ("args", text). ``names``: the
    request's tool names: a body the output ended inside (cut by ``max_tokens``) that has written one of them
    whole as its ``"name"`` is that call, with ``{}`` (as the XML format's call stands once its name is out)."""

    def __init__(self, forced_name: str | None = None, names=frozenset()):
        self._forced = forced_name
        self._names = names
        self._parts = [_call_prefix(forced_name)] if forced_name is not None else []

    def push(self, text: str) -> list[tuple[str, str]]:
        self._parts.append(text)
        return []

    def close(self, closed: bool) -> list[tuple[str, str]] | None:
        body = "".join(self._parts)
        call = parse_hermes_block(body)
        if call is None and self._forced is not None:
            # The outer object's own "}" is the one a model most often leaves out.
            call = parse_hermes_block(body.rstrip() + "}") or (self._forced, "{}")
        if call is None and not closed:
            call = self._cut_call(body)
        if call is None:
            return None
        return [("header", call[0]), ("args", call[1])]

    def _cut_call(self, body: str) -> tuple[str, str] | None:
        m = _CUT_NAME.match(body)
        if m is None:
            return None
        try:
            name = strict_json.loads(m.group(1))
        except ValueError:
            return None
        return (name, "{}") if name in self._names else None
