"""CLI flags derived from frozen config dataclasses.

A process's config is one frozen dataclass; each field's ``metadata`` holds
its help text (and optionally ``choices``, ``flag`` and a ``parse`` function).
``add_flags`` turns the fields into ``--kebab-case`` flags and
``from_args`` builds the config back, so flags, help and defaults are
defined once. Byte sizes accept suffixes (``2G``, ``512M``, ``64K``). A
boolean flag takes on/off, and given bare (``--allow-torch-fallback``) means on.
``aliases`` are other names of the same flag (vLLM's and SGLang's, so their
command lines work: ``--max-num-seqs`` is ``--decode-lanes``); a boolean's
``off_aliases`` are bare names that turn it off (``--no-enable-prefix-caching``).
Children and logs see the canonical flag only.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class FlagValueError(argparse.ArgumentTypeError, ValueError):
    """A flag's value is malformed: a ValueError to callers, and its message is what argparse shows."""


def parse_bytes(text: str | int) -> int:
    """'2G' -> 2147483648; plain integers pass through. Raises ``FlagValueError`` (a ValueError)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise FlagValueError(f"not a byte size: {text!r} (examples: 1048576, 512M, 2G)")
    unit = (m.group(2) or "").lower()[:1]
    return int(float(m.group(1)) * _UNITS[unit])


_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)([kKmMgG])\s*$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_count(text: str | int) -> int:
    """A token count as vLLM writes one: '32768', '32k' (32,000), '32K' (32,768), '25.6k'. Raises
    ArgumentTypeError, whose message argparse shows."""
    if isinstance(text, int):
        return text
    m = _COUNT.match(str(text))
    if not m:
        try:
            return int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a token count: {text!r} (examples: 32768, 32k, 32K)") from None
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(f"{text!r}: a binary suffix ({suffix}) takes a whole number; did you mean "
                                         f"{number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def parse_optional_count(text: str | int | None) -> int | None:
    """``parse_count``, with 'auto' and -1 meaning none given (the default decides)."""
    if text is None or str(text).strip() in ("auto", "-1"):
        return None
    return parse_count(text)


def field_doc(help_text: str, **extra) -> dict:
    """Metadata for a config field: ``field(default=..., metadata=field_doc("..."))``."""
    return {"help": help_text, **extra}


def _base_type(tp):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(text: str) -> bool:
    low = str(text).lower()
    if low in _ON:
        return True
    if low in _OFF:
        return False
    raise argparse.ArgumentTypeError(f"expected on/off, got {text!r}")


def positionals_first(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with a word that follows a bare boolean flag and is no on/off value moved to the front, where
    the parser reads it as its positional: vLLM's ``serve --trust-remote-code MODEL`` (its booleans take no
    value; ours take an optional on/off)."""
    bools = {s for a in parser._actions if a.type is _bool for s in a.option_strings}
    out, moved = [], []
    for i, word in enumerate(argv):
        after_bool = i > 0 and argv[i - 1] in bools
        if after_bool and not word.startswith("-") and word.lower() not in _ON + _OFF:
            moved.append(word)
        else:
            out.append(word)
    return moved + out


def add_flags(parser: argparse.ArgumentParser, config_cls, skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        if f.name in skip or f.metadata.get("cli") is False:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        tp = _base_type(hints[f.name])
        kwargs = {"dest": f.name, "help": f.metadata.get("help", "")}
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if "parse" in f.metadata:
            kwargs["type"] = f.metadata["parse"]
        elif tp is bool:
            kwargs["type"] = _bool
            kwargs["metavar"] = "on|off"
            kwargs["nargs"] = "?"
            kwargs["const"] = True
        elif tp in (int, float, str):
            kwargs["type"] = tp
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("repeat"):
            kwargs["action"] = "extend" if f.metadata.get("nargs") else "append"
            if f.metadata.get("nargs"):  # --flag A B, or --flag A --flag B
                kwargs["nargs"] = f.metadata["nargs"]
            kwargs["default"] = None
        else:
            kwargs["default"] = default
        if default not in (None, "", ()) and not f.metadata.get("repeat"):
            kwargs["help"] += f" (default: {default})"
        parser.add_argument(flag, *f.metadata.get("aliases", ()), **kwargs)
        off = f.metadata.get("off_aliases", ())
        if off:
            parser.add_argument(*off, dest=f.name, action="store_const", const=False, default=argparse.SUPPRESS,
                                help=f"the same as {flag} off")


def from_args(config_cls, args: argparse.Namespace, **overrides):
    values = {}
    for f in dataclasses.fields(config_cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            if value is None and f.metadata.get("repeat"):
                continue
            if isinstance(value, list) and f.metadata.get("repeat"):
                value = tuple(value)
            values[f.name] = value
    values.update(overrides)
    return config_cls(**values)
