"""vLLM's structured-output fields, as the grammar the engine constrains output with.

    structured_outputs.json      guided_json      one JSON value valid under a JSON Schema (object or JSON text)
    structured_outputs.regex     guided_regex     text the whole regular expression matches (Rust ``regex`` syntax)
    structured_outputs.choice    guided_choice    exactly one of 1..MAX_CHOICES strings
    structured_outputs.grammar   guided_grammar   text llguidance's Lark grammar derives
    structured_outputs.json_object: true          one JSON object

The ``guided_*`` fields are vLLM's older top-level spellings. One of them in
all may be given; two, an empty ``structured_outputs``, or a
``structural_tag`` are 400s naming the fields. vLLM's tuning options
(``whitespace_pattern``, ``disable_any_whitespace``,
``disable_additional_properties``, ``disable_fallback``,
``guided_decoding_backend``) are ignored: JSON whitespace is always
``grammars.JSON_WHITESPACE``.

``parse_structured_outputs`` builds the grammar unchecked; whether the library
compiles it is ``response_format``'s check, which also refuses it beside a
JSON ``response_format``. Like any grammar it cannot be combined with
``ignore_eos``, ``min_tokens`` or (chat) a required or named ``tool_choice``;
those 400s are raised here so that they name the field that asked (the checks
in ``params`` and ``chat`` name ``response_format``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ignis.gateway.errors import ApiError, invalid
from ignis.gateway.fields import Fields
from ignis.gateway.grammars import choice_grammar, json_schema_grammar, lark_grammar, regex_grammar
from ignis.gateway.request_limits import MAX_DEPTH, text_depth

KINDS = ("json", "regex", "choice", "grammar", "json_object")
LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 4096
MAX_SOURCE_CHARS = 64 << 10
"""Longest regular expression, grammar or schema text. Checks and compiles run off the gateway's and the engine's
loops, but the engine computes each constrained token's mask on its own (the first masks of a grammar build
its lexer: their cost grows with its alternatives), so a grammar stays within what masks in milliseconds."""

WHAT = {"json": "JSON schema", "regex": "regular expression", "choice": "choice list", "grammar": "Lark grammar",
        "json_object": "JSON object constraint"}

GBNF_HINT = "(GBNF's `name ::= ...` rules are not Lark: write `start: ...`, see llguidance's Lark syntax)"


@dataclass(frozen=True)
class Asked:
    """One structured output a request asked for: ``grammar`` is unchecked."""

    param: str
    """The field as errors name it: ``guided_regex``, ``structured_outputs.choice``."""
    what: str
    """What a refusal calls it: "regular expression", "JSON schema", ..."""
    grammar: str
    hint: str = ""
    """Said after the library's reason when the grammar does not compile."""

    def error(self, message: str) -> ApiError:
        return invalid(f"{self.param}: {message}", self.param)


def _given(f: Fields) -> list[tuple[Fields, str, str]]:
    """(fields holding it, its name there, its kind) of every structured output the body names."""
    holders = [f]
    given = [(f, name, kind) for name, kind in LEGACY.items() if f.has(name)]
    so = f.object("structured_outputs")
    if so is not None:
        holders.append(so)
        inner = [(so, kind, kind) for kind in KINDS if so.has(kind) and (kind != "json_object" or so.bool(kind))]
        if not inner and not so.has("structural_tag"):
            raise invalid(f"structured_outputs: needs one of {', '.join(KINDS)}", "structured_outputs")
        given += inner
    for where in holders:
        if where.has("structural_tag"):
            raise where.error("structural_tag", "is not supported; use json, regex, choice or grammar")
    return given


def _schema(f: Fields, name: str) -> dict | bool:
    value = f.raw(name)
    if isinstance(value, str):
        if len(value) > MAX_SOURCE_CHARS:
            raise f.error(name, f"is {len(value)} characters, at most {MAX_SOURCE_CHARS} allowed")
        if text_depth(value) > MAX_DEPTH:
            raise invalid(f"{f.param(name)} nests more than {MAX_DEPTH} levels deep", f.param(name),
                          code="nesting_too_deep")
        try:
            value = json.loads(value)
        except ValueError as e:
            raise f.error(name, f"is not valid JSON: {e}") from None
    if type(value) is not dict and value is not True:
        raise f.error(name, "must be a JSON Schema object (or a string holding one)")
    return value


def _choices(f: Fields, name: str) -> list[str]:
    items = f.list(name, max_items=MAX_CHOICES)
    if not items:
        raise f.error(name, "must hold at least one string")
    for i, item in enumerate(items):
        if type(item) is not str:
            raise f.error(name, f"item {i} must be a string")
        if len(item) > MAX_CHOICE_CHARS:
            raise f.error(name, f"item {i} is {len(item)} characters, at most {MAX_CHOICE_CHARS} allowed")
    return items


def _grammar(f: Fields, name: str, kind: str) -> str:
    if kind == "json_object":
        return json_schema_grammar({"type": "object"})
    if kind == "json":
        try:
            return json_schema_grammar(_schema(f, name))
        except ValueError as e:
            raise f.error(name, f"is not a usable JSON schema: {e}") from None
    if kind == "choice":
        return choice_grammar(_choices(f, name))
    text = f.str(name, max_chars=MAX_SOURCE_CHARS)
    return regex_grammar(text) if kind == "regex" else lark_grammar(text)


def _refuse_conflicts(f: Fields, param: str) -> None:
    """The rules of any grammar, named for ``param``."""
    if f.bool("ignore_eos"):
        raise f.error("ignore_eos", f"cannot be combined with {param} (the output ends where the grammar does)")
    if f.int("min_tokens", 0, 0):
        raise f.error("min_tokens", f"cannot be combined with {param} (the grammar decides the end)")
    choice = f.raw("tool_choice")
    if f.has("messages") and (choice == "required" or isinstance(choice, dict)):
        raise invalid(f"{param} cannot be combined with a required or named tool_choice: the call's arguments "
                      "follow the tool's parameters schema", param)


def parse_structured_outputs(f: Fields) -> Asked | None:
    """The structured output the body asks for (vLLM's fields), or None when it names none."""
    given = _given(f)
    if not given:
        return None
    params = [where.param(name) for where, name, _ in given]
    if len(given) > 1:
        raise invalid(f"{params[1]}: only one structured output may be given, got {' and '.join(params)}",
                      params[1])
    where, name, kind = given[0]
    _refuse_conflicts(f, params[0])
    source = where.raw(name)
    hint = GBNF_HINT if kind == "grammar" and isinstance(source, str) and "::=" in source else ""
    return Asked(params[0], WHAT[kind], _grammar(where, name, kind), hint)
