"""Dataclass values <-> JSON values, driven by the fields' declared types.

Every wire message and every value nested in one is a dataclass; its field
annotations say what JSON a peer must send. ``from_json`` enforces them
strictly on what came off the wire, before the class's own checks
(``__post_init__``) see the value:

    int              a JSON integer (never a bool, never a float)
    float            a JSON number, integer or not (never a bool); the class widens it
    bool             true or false
    str              a string
    X | None         null, or an X
    tuple[X, ...]    a list of X, built as a tuple
    tuple[X, Y]      a list of exactly an X then a Y ("pair"), built as a tuple
    dict             an object, passed on as it is (the class checks its entries)
    a dataclass      an object holding exactly that class's fields, built by calling it

``to_json`` goes the other way: a dataclass becomes an object of its fields in
declaration order, a tuple a list. Errors are TypeError or ValueError naming
the field's path (``blocks[0].runs``). Pure Python (no orjson, numpy or torch),
so tier layouts can be written and read on a bare GPU machine.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from functools import cache

_UNIONS = (typing.Union, types.UnionType)
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@cache
def field_types(cls: type) -> tuple[tuple[str, object], ...]:
    """``(name, declared type)`` of each field of dataclass ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def to_json(value: object) -> object:
    """``value`` as plain JSON values: dataclasses as objects, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: to_json(getattr(value, name)) for name, _ in field_types(type(value))}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(kind: object, value: object, name: str) -> object:
    """``value`` (decoded JSON) as declared type ``kind``; anything else is refused."""
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]  # e.g. TokenFrame read from JSON: its plain type
    if kind in _NAMES:
        ok = type(value) is kind or (kind is float and type(value) is int)
        if not ok:
            raise TypeError(f"{name} must be {_NAMES[kind]}, got {type(value).__name__}")
        return value
    origin = typing.get_origin(kind)
    if origin in _UNIONS:
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"{name}: only X | None unions travel on the wire, not {kind}")
        return None if value is None else from_json(options[0], value, name)
    if kind is dict or origin is dict:
        if type(value) is not dict:
            raise TypeError(f"{name} must be a dict (JSON object), got {type(value).__name__}")
        return value
    if origin is tuple:
        return _tuple_from_json(typing.get_args(kind), value, name)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return dataclass_from_json(kind, value, name)
    raise TypeError(f"{name}: type {kind} has no wire form")


def dataclass_from_json(cls: type, value: object, name: str = "") -> object:
    """An object holding exactly the fields of dataclass ``cls``, built into one."""
    if type(value) is not dict:
        raise TypeError(f"{name or cls.__name__} must be an object, got {type(value).__name__}")
    fields = field_types(cls)
    check_field_names(value, [n for n, _ in fields], where=name)
    prefix = f"{name}." if name else ""
    return cls(**{n: from_json(kind, value[n], prefix + n) for n, kind in fields})


def _tuple_from_json(items: tuple, value: object, name: str) -> tuple:
    if type(value) is not list:
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    if len(items) == 2 and items[1] is Ellipsis:
        return tuple(from_json(items[0], v, f"{name}[{i}]") for i, v in enumerate(value))
    if len(value) != len(items):
        shape = "pair" if len(items) == 2 else f"list of {len(items)} values"
        raise ValueError(f"{name} must be a [{', '.join(getattr(t, '__name__', str(t)) for t in items)}] {shape}, "
                         f"got {len(value)} values")
    return tuple(from_json(kind, v, f"{name}[{i}]") for i, (kind, v) in enumerate(zip(items, value)))


def check_field_names(obj: dict, required: Iterable[str], optional: Iterable[str] = (), where: str = "") -> None:
    """Refuse an object missing a ``required`` key or holding a key that is neither required nor optional."""
    required = tuple(required)
    known = {*required, *optional}
    at = f"{where}: " if where else ""
    missing = [k for k in required if k not in obj]
    if missing:
        raise ValueError(f"{at}missing {_field_list(missing)}")
    extra = sorted(str(k) for k in obj if k not in known)
    if extra:
        raise ValueError(f"{at}unknown {_field_list(extra)}")


def _field_list(names: list[str]) -> str:
    return ("field " if len(names) == 1 else "fields ") + ", ".join(map(repr, names))
