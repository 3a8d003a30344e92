"""``response_format``: text, json_object or json_schema, as the grammar the engine constrains output with.

    {"type": "text"}                                       no grammar
    {"type": "json_object"}                                one JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
                                                           one JSON value valid under schema

``strict`` is accepted either way: the output is always held to the schema.
A schema the grammar library refuses (an unknown type, a dangling ``$ref``, a
bad ``pattern``, a keyword it does not implement) is a 400 naming
``response_format.json_schema.schema`` and the library's reason. Each
grammar's check is remembered (bounded), so a schema sent again is not
compiled again here.

vLLM's structured-output fields (``structured_outputs``, ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``: see
``gateway/structured_outputs.py``) are the other way to ask for a grammar;
``parse_response_format`` returns whichever the body gives, checked the same
way (a 400 naming the field, with the library's reason). Both at once, beside
a JSON response_format, is a 400.
"""

from __future__ import annotations

from functools import lru_cache

from ignis.gateway.fields import Fields
from ignis.gateway.grammars import grammar_error, json_schema_grammar
from ignis.gateway.structured_outputs import parse_structured_outputs
from ignis.shared.wire_fields import MAX_GRAMMAR_CHARS

FORMATS = ("text", "json_object", "json_schema")
CHECKED_GRAMMARS = 256
CACHED_GRAMMAR_CHARS = 64 << 10
"""Checks of grammars up to this size are remembered (at most ``CHECKED_GRAMMARS`` of them)."""


@lru_cache(maxsize=CHECKED_GRAMMARS)
def _remembered(grammar: str) -> str:
    return grammar_error(grammar)


def checked_grammar(grammar: str) -> str:
    """``grammar_error(grammar)``, remembered for grammars up to ``CACHED_GRAMMAR_CHARS``."""
    return _remembered(grammar) if len(grammar) <= CACHED_GRAMMAR_CHARS else grammar_error(grammar)


def parse_response_format(f: Fields) -> str | None:
    """The grammar ``response_format`` or vLLM's structured-output fields ask for; None when neither does."""
    grammar = _response_format_grammar(f)
    asked = parse_structured_outputs(f)
    if asked is None:
        return grammar
    if grammar is not None:
        raise asked.error("cannot be combined with a JSON response_format: give one of them")
    if len(asked.grammar) > MAX_GRAMMAR_CHARS:
        raise asked.error(f"is too large ({len(asked.grammar)} characters compiled, at most {MAX_GRAMMAR_CHARS})")
    error = checked_grammar(asked.grammar)
    if error:
        raise asked.error(f"is not a usable {asked.what}: {error.rstrip()} {asked.hint}".rstrip())
    return asked.grammar


def _response_format_grammar(f: Fields) -> str | None:
    """The grammar ``response_format`` asks for; None for text or no response_format."""
    fmt = f.object("response_format")
    if fmt is None:
        return None
    kind = fmt.str("type", None, choices=FORMATS)
    if kind is None:
        raise fmt.error("type", "is required")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"})
    spec = fmt.object("json_schema")
    if spec is None:
        raise fmt.error("json_schema", "is required with type json_schema")
    spec.str("name", None, max_chars=256)
    spec.bool("strict")
    schema = spec.raw("schema")
    if schema is None:
        raise spec.error("schema", "is required")
    if type(schema) is not dict and schema is not True:
        raise spec.error("schema", "must be a JSON Schema object")
    try:
        grammar = json_schema_grammar(schema)
    except ValueError as e:
        raise spec.error("schema", f"is not a usable JSON schema: {e}") from None
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise spec.error("schema", f"is too large ({len(grammar)} characters compiled, at most {MAX_GRAMMAR_CHARS})")
    error = checked_grammar(grammar)
    if error:
        raise spec.error("schema", f"is not a usable JSON schema: {error}")
    return grammar
