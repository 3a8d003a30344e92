"""The Qwen3.5 (qwen3_xml) tool-call format: one block's body parsed as it streams, values typed by schema.

Inside ``<tool_call>`` ... ``</tool_call>`` the model writes::

    <function=NAME>
    <parameter=P>
    VALUE            (any text, several lines allowed)
    </parameter>
    ...
    </function>

The block is a call once ``<function=NAME>`` is complete (only whitespace
before it): the header event goes out then, and each parameter becomes an
argument fragment as soon as its value ends (at ``</parameter>``, or leniently
at the next ``<parameter=`` or ``</function>``). Fragments concatenate to a
JSON object: ``{"P": v`` then ``, "Q": w`` ... then ``}``. Text between
parameters is ignored; a parameter written again keeps its first value (its
fragment is out already: one JSON object, no duplicate keys). A body that does
not start with ``<function=NAME>`` is not a call (``close`` returns None, and
the caller shows it as content).

One newline at each end of a value is the format's, not the value's. A value
is typed by the tool's JSON schema (``parameters.properties[P].type``, or,
without one, the types of its ``enum``/``const`` values: ``schema_types``):
strings stay strings; numbers, booleans, null, objects and arrays are parsed
as JSON, falling back to the string when that fails; a parameter the schema
does not know, or whose schema says nothing of its type, stays a string.
Where the types hold ``string`` and others (``["string", "null"]``,
``["integer", "string"]``), text that is JSON of one of the others is that
value (``null`` is None, ``5`` is 5) and any other text the string:
``grammars`` writes such a value by the same rule. JSON's ``NaN``/``Infinity``
are never numbers here (they are not JSON). Pure Python.
"""

from __future__ import annotations

import json
import re

from ignis.gateway import strict_json

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
MAX_NAME_CHARS = 256
_NAME = re.compile(r"[^\s<>]+")
_JSON_TYPES = frozenset(("integer", "number", "boolean", "null", "object", "array"))
_MARKER_TAIL = max(map(len, (FUNCTION_CLOSE, PARAM_OPEN, PARAM_CLOSE))) - 1
"""Characters at a buffer's end that may still grow into a marker."""


def xml_opener(name: str | None) -> str:
    """What the prompt ends with to force a call of ``name`` (any call when None), after ``<tool_call>``."""
    return "\n" if name is None else f"\n{FUNCTION_OPEN}{name}>\n"


def schema_types(schema: object) -> set[str]:
    """The JSON types a parameter's schema allows (empty: any): its ``type``, or without one the types of
    its ``enum`` (or ``const``) values when they are all scalars; any for a schema made of others
    (``anyOf``, ``oneOf``, ``allOf``, ``$ref``, or a ``const`` not a scalar); else a string
    (a schema that says nothing of its type, as vLLM's qwen3_coder and the grammar read it: raw text)."""
    if not isinstance(schema, dict):
        return {"string"}
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    values = scalar_values(schema)
    if values:
        return {json_type(v) for v in values}
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "const")):
        return set()
    return {"string"}


def scalar_values(schema: dict) -> list | None:
    """The values a schema's ``enum`` (or ``const``) allows when each is a JSON scalar; None otherwise."""
    values = schema.get("enum")
    if not isinstance(values, list):
        values = [schema["const"]] if "const" in schema else None
    if not values or not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
        return None
    return values


def json_type(value: object) -> str:
    """The JSON Schema type name of a parsed JSON value (an int is "integer")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "")


def _fits(value: object, types: set[str]) -> bool:
    kind = json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


def parameter_types(tools: list[dict] | None) -> dict[str, dict[str, set[str]]]:
    """function name -> parameter name -> the JSON types its schema allows (empty: any)."""
    out: dict[str, dict[str, set[str]]] = {}
    for tool in tools or ():
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name")] = {pname: schema_types(schema)
                               for pname, schema in (props.items() if isinstance(props, dict) else ())}
    return out


def typed_value(raw: str, types: set[str] | None) -> object:
    """``raw`` as the schema types it; ``types`` None: the parameter is unknown (a string)."""
    if types is None:
        return raw
    if "string" in types:
        others = types & _JSON_TYPES
        if not others:
            return raw
        try:
            value = strict_json.loads(raw)
        except ValueError:
            return raw
        return value if _fits(value, others) else raw
    if types and not types & _JSON_TYPES:
        return raw
    try:
        return strict_json.loads(raw)
    except ValueError:
        if "boolean" in types and raw.strip() in ("True", "False"):
            return raw.strip() == "True"
        return raw


def _trim_value(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _first(buf: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    """The earliest of ``markers`` in ``buf`` from ``start``: (position, marker), or (-1, "")."""
    best, which = -1, ""
    for m in markers:
        at = buf.find(m, start)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, m
    return best, which


class XmlCallBlock:
    """One ``<tool_call>`` body; ``push`` text, then ``close`` once. Events: ("header", name), ("args", text)."""

    def __init__(self, types: dict[str, dict[str, set[str]]], forced_name: str | None = None):
        self._types = types
        self._buf = ""
        self._written: set[str] = set()  # parameter names given a value (their fragments are out)
        self._open: str | None = None  # the parameter whose value is being read
        self._resume = 0  # where the search for the open value's end continues
        self.name: str | None = None
        self._state = "head"  # head -> params -> done; or head -> raw: not a call
        self._pending: list[tuple[str, str]] = []
        if forced_name is not None:
            self._commit(forced_name)

    def push(self, text: str) -> list[tuple[str, str]]:
        events, self._pending = self._pending, []
        if self._state in ("raw", "done"):
            return events  # nothing more to read: the caller keeps the text as written
        self._buf += text
        if self._state == "head":
            self._head(events)
        if self._state == "params":
            self._scan(events, closing=False)
        return events

    def close(self, closed: bool) -> list[tuple[str, str]] | None:
        """The remaining events; ``closed``: ``</tool_call>`` was seen (else the output ended inside the
        block, and a value still open is dropped). None: the body was not a call."""
        events, self._pending = self._pending, []
        if self._state == "head":
            self._head(events, final=True)
        if self.name is None:
            return None
        if self._state == "params":
            self._scan(events, closing=closed)
        events.append(("args", "}" if self._written else "{}"))
        self._state = "done"
        return events

    def _commit(self, name: str) -> None:
        self.name = name
        self._pending.append(("header", name))
        self._state = "params"

    def _head(self, events: list, final: bool = False) -> None:
        head = self._buf.lstrip()
        if head.startswith(FUNCTION_OPEN):
            end = head.find(">", len(FUNCTION_OPEN))
            name = head[len(FUNCTION_OPEN):end if end >= 0 else len(head)]
            if end >= 0 and _NAME.fullmatch(name) and len(name) <= MAX_NAME_CHARS:
                self._buf = head[end + 1:]
                self._commit(name)
                events.extend(self._pending)
                self._pending = []
                return
            if end < 0 and not final and len(name) <= MAX_NAME_CHARS and (not name or _NAME.fullmatch(name)):
                return  # the name is still coming
        elif not final and FUNCTION_OPEN.startswith(head):
            return
        self._state = "raw"  # not a call: kept whole for the caller

    def _scan(self, events: list, closing: bool) -> None:
        """Emit every parameter whose value has ended; at ``closing`` also the one still open.

        Between parameters the buffer keeps only what may start a marker; inside a
        value, the search for its end resumes where the last one stopped.
        """
        while self._state == "params":
            if self._open is None:
                buf = self._buf
                at, marker = _first(buf, (PARAM_OPEN, FUNCTION_CLOSE))
                if at < 0:
                    self._buf = buf[len(buf) - _MARKER_TAIL:] if len(buf) > _MARKER_TAIL else buf
                    return
                if marker == FUNCTION_CLOSE:
                    self._buf, self._state = "", "done"
                    return
                name_end = buf.find(">", at + len(PARAM_OPEN))
                if name_end < 0:
                    return
                self._open = buf[at + len(PARAM_OPEN):name_end]
                self._buf, self._resume = buf[name_end + 1:], 0
            buf = self._buf
            end, stop = _first(buf, (PARAM_CLOSE, PARAM_OPEN, FUNCTION_CLOSE), self._resume)
            if end < 0:
                if not closing:
                    self._resume = max(0, len(buf) - _MARKER_TAIL)
                    return
                end = len(buf)
            self._param(events, self._open, _trim_value(buf[:end]))
            self._open = None
            self._buf = buf[end + len(PARAM_CLOSE):] if stop == PARAM_CLOSE else buf[end:]

    def _param(self, events: list, pname: str, raw: str) -> None:
        if pname in self._written:  # written twice: the first value stands (its fragment is already out)
            return
        lead = ", " if self._written else "{"
        self._written.add(pname)
        types = self._types.get(self.name or "", {}).get(pname)
        value = typed_value(raw, types)
        events.append(("args", lead + json.dumps(pname, ensure_ascii=False) + ": "
                       + json.dumps(value, ensure_ascii=False)))


def parse_xml_block(body: str, types: dict[str, dict[str, set[str]]]) -> tuple[str, str] | None:
    """A whole block body as ``(name, arguments JSON)``, or None when it is not an XML call."""
    block = XmlCallBlock(types)
    events = block.push(body)
    rest = block.close(closed=True)
    if rest is None:
        return None
    events += rest
    return block.name or "", "".join(text for kind, text in events if kind == "args")
