"""JSON text read strictly, as the API's JSON is: no NaN or Infinity, no lone UTF-16 surrogate.

Python's ``json.loads`` takes ``NaN`` and ``Infinity``, turns ``1e999`` into
an infinite float and ``"\\ud800"`` into a string that cannot be encoded as
UTF-8. What the model writes as a call's arguments, and the arguments a
client sends inside a string, are read here: a value the JSON the server
writes could not carry (``orjson`` refuses both) is not JSON.
"""

from __future__ import annotations

import json
import math


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def loads(text: str, *, finite: bool = True) -> object:
    """``text`` as JSON; ValueError when it is not JSON, holds a string or key with a lone surrogate, or
    (``finite``) a number that is NaN or infinite, or overflows to one."""
    value = json.loads(text, parse_constant=_not_json if finite else None)
    problem = _unwritable(value, finite)
    if problem is not None:
        raise ValueError(problem)
    return value


def _unwritable(value: object, finite: bool) -> str | None:
    """Why ``value`` (parsed JSON) cannot be written back as UTF-8 JSON, or None. Walks without recursion:
    ``json.loads`` takes nesting up to the interpreter's recursion limit."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not _utf8(v):
                return "a string holds a lone UTF-16 surrogate"
        elif isinstance(v, float):
            if finite and not math.isfinite(v):
                return "a number is not finite"
        elif isinstance(v, dict):
            for k, item in v.items():
                if not _utf8(k):
                    return "a key holds a lone UTF-16 surrogate"
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
