"""Typed reads of a JSON request body's fields, each failure a 400 naming the field.

``Fields(obj, "messages[0]")`` reads one JSON object. A ``null`` value counts
as absent (OpenAI clients send explicit nulls for unset options). Numbers are
strict about JSON types: ``true`` is not a number, ``"1"`` is not an integer,
``2.0`` is accepted as the integer 2.
"""

from __future__ import annotations

import math

from ignis.gateway.errors import ApiError, invalid


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


class Fields:
    """Reads fields of one JSON object; ``where`` prefixes the param names in errors."""

    def __init__(self, obj: object, where: str = ""):
        if not isinstance(obj, dict):
            raise invalid(f"{where or 'the request body'} must be a JSON object, got {_kind(obj)}", where or None)
        self.obj = obj
        self.where = where
        self.read: set[str] = set()
        """The names asked for so far (present or not): what ``unread`` leaves out."""

    def param(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def _value(self, name: str) -> object:
        self.read.add(name)
        return self.obj.get(name)

    def has(self, name: str) -> bool:
        return self._value(name) is not None

    def raw(self, name: str) -> object:
        return self._value(name)

    def passed_over(self, *names: str) -> None:
        """Fields the parser takes that lost to another spelling (``max_tokens`` beside
        ``max_completion_tokens``) or to a header: known, so not reported by ``unread``."""
        self.read.update(names)

    def unread(self) -> list[str]:
        """The fields given (not null) that nothing has asked for: what the request carried to no effect."""
        return [name for name, value in self.obj.items() if value is not None and name not in self.read]

    def error(self, name: str, message: str) -> ApiError:
        return invalid(f"{self.param(name)}: {message}", self.param(name))

    def bool(self, name: str, default: bool = False) -> bool:
        value = self._value(name)
        if value is None:
            return default
        if type(value) is not bool:
            raise self.error(name, f"must be true or false, got {_kind(value)}")
        return value

    def int(self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self._value(name)
        if value is None:
            return default
        if type(value) is float and value.is_integer():
            if abs(value) >= 2.0 ** 53:  # not exact: an integer past int64 that the JSON parser made a float
                where = f"in [{lo}, {hi}]" if lo is not None and hi is not None else "of at most 53 bits as a float"
                raise self.error(name, f"must be an integer {where}, got {value:g}")
            value = int(value)
        if type(value) is not int:
            raise self.error(name, f"must be an integer, got {_kind(value)}")
        if lo is not None and value < lo:
            raise self.error(name, f"must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise self.error(name, f"must be at most {hi}, got {value}")
        return value

    def number(self, name: str, default: float | None, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
        value = self._value(name)
        if value is None:
            return default
        if type(value) not in (int, float) or (type(value) is float and not math.isfinite(value)):
            raise self.error(name, f"must be a finite number, got {_kind(value)}")
        if value < lo or (lo_open and value == lo) or value > hi:
            low = "(" if lo_open else "["
            raise self.error(name, f"must be in {low}{lo:g}, {hi:g}], got {value:g}")
        return float(value)

    def str(self, name: str, default: str | None = None, choices: tuple[str, ...] | None = None,
            max_chars: int = 1 << 20) -> str | None:
        value = self._value(name)
        if value is None:
            return default
        if type(value) is not str:
            raise self.error(name, f"must be a string, got {_kind(value)}")
        if choices is not None and value not in choices:
            raise self.error(name, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
        if len(value) > max_chars:
            raise self.error(name, f"is {len(value)} characters, at most {max_chars} allowed")
        return value

    def list(self, name: str, *, required: bool = False, max_items: int | None = None) -> list | None:
        value = self._value(name)
        if value is None:
            if required:
                raise self.error(name, "is required")
            return None
        if type(value) is not list:
            raise self.error(name, f"must be an array, got {_kind(value)}")
        if max_items is not None and len(value) > max_items:
            raise self.error(name, f"has {len(value)} items, at most {max_items} allowed")
        return value

    def object(self, name: str) -> Fields | None:
        value = self._value(name)
        if value is None:
            return None
        if type(value) is not dict:
            raise self.error(name, f"must be an object, got {_kind(value)}")
        return Fields(value, self.param(name))
