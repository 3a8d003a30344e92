"""Grammars for constrained output, as llguidance grammar text the engine compiles.

- ``json_schema_grammar(schema)``: output that is one JSON value valid under
  ``schema`` (``response_format`` json_schema; json_object is the schema
  ``{"type": "object"}``).
- ``tool_call_grammar(tool, parser)``: the rest of a forced call of ``tool``
  after its opener, which the prompt already ends with:

      xml     <tool_call>\\n<function=NAME>\\n  |  <parameter=P>\\nVALUE\\n</parameter>\\n ... </function>\\n</tool_call>
      hermes  <tool_call>\\n{"name": "NAME", "arguments":  |  {ARGUMENTS} }\\n</tool_call>

  (opener | what the grammar allows). XML parameters come in the schema's
  property order, each at most once, the required ones always; a parameter
  of type string (or without a type) is raw text up to the first
  ``\\n</parameter>``, an enum of strings one of its values, any other value
  JSON valid under its schema. Hermes arguments are one JSON object valid
  under the tool's ``parameters``.

``after_reasoning(grammar)`` lets a reasoning block the prompt opened run
free first: any text up to and including ``</think>``, up to two newlines,
then ``grammar``.

JSON anywhere is llguidance's JSON Schema compiler (``%json{...}`` inside Lark)
with whitespace between tokens limited to ``JSON_WHITESPACE``, so a model
cannot pad forever. ``grammar_error`` is the library's complaint about a
grammar ("" when it compiles); the engine compiles each grammar once more with
the model's vocabulary. No torch.
"""

from __future__ import annotations

import json

import llguidance

JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,8}"
"""Whitespace allowed at each place JSON allows it: up to 8 spaces, newlines or tabs."""

JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}

TOOL_PARSERS = ("xml", "hermes")

# Raw text of an XML parameter: anything up to, and then including, the first "\n</parameter>\n".
_XML_TERMINALS = r"""
RAW_TEXT: /(.|\n)*/ & ~/(.|\n)*\n<\/parameter>(.|\n)*/
RAW_VALUE: RAW_TEXT "\n</parameter>\n"
"""


_REASONING = r"""start: THOUGHT AFTER_THOUGHT @answer
THOUGHT: THOUGHT_TEXT "</think>"
THOUGHT_TEXT: /(.|\n)*/ & ~/(.|\n)*<\/think>(.|\n)*/
AFTER_THOUGHT: /\n{0,2}/
"""


def _with_options(schema: dict) -> dict:
    """``schema`` with our JSON options as llguidance's ``x-guidance`` (the schema's own win)."""
    return dict(schema, **{"x-guidance": JSON_OPTIONS | dict(schema.get("x-guidance") or {})})


def json_schema_grammar(schema: dict | bool) -> str:
    """The grammar of one JSON value valid under ``schema`` (a JSON Schema object, or true)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)


def grammar_error(grammar: str) -> str:
    """The library's error for ``grammar``, or "" when it compiles (warnings are not errors)."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else ""


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON escapes are Lark escapes


def _json_rule(schema: object) -> str:
    return "%json " + json.dumps(_with_options(schema if isinstance(schema, dict) else {}))


def _xml_value(schema: object) -> str:
    """The rule body of one parameter's value followed by its closing line."""
    schema = schema if isinstance(schema, dict) else {}
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        options = " | ".join(_lark_string(v) for v in enum)
        return f'({options}) "\\n</parameter>\\n"'
    kind = schema.get("type")
    if kind in (None, "string") and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "const")):
        return "RAW_VALUE"
    return f'{_json_rule(schema)} "\\n</parameter>\\n"'


def _xml_grammar(params: dict) -> str:
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise ValueError("parameters.properties must be an object")
    required = set(params.get("required") or ())
    rules, parts = [], []
    for k, (name, schema) in enumerate(props.items()):
        if "\n" in name or ">" in name:
            raise ValueError(f"parameter name {name!r} cannot appear in a <parameter=...> tag")
        rules.append(f"p{k}: {_lark_string(f'<parameter={name}>' + chr(10))} {_xml_value(schema)}")
        parts.append(f"p{k}" if name in required else f"p{k}?")
    body = " ".join(parts + ['"</function>\\n</tool_call>"'])
    return "\n".join([f"start: {body}", *rules, _XML_TERMINALS])


def _hermes_grammar(params: dict) -> str:
    return f'start: {_json_rule(params)} "}}\\n</tool_call>"\n'


def tool_call_grammar(tool: dict, parser: str) -> str:
    """The grammar of what follows the opener of a forced call of ``tool`` (an OpenAI tool object).

    ``parser``: "xml" (Qwen3.5) or "hermes" (Qwen3-Next). Raises ValueError
    for a tool whose parameters cannot be written in that format.
    """
    if parser not in TOOL_PARSERS:
        raise ValueError(f"tool parser must be one of {', '.join(TOOL_PARSERS)}, got {parser!r}")
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict):
        raise ValueError("a tool must be an object")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ValueError("function.parameters must be an object")
    lark = _xml_grammar(params) if parser == "xml" else _hermes_grammar(params)
    return llguidance.LLMatcher.grammar_from_lark(lark)


def after_reasoning(grammar: str) -> str:
    """``grammar`` (llguidance's JSON form, or Lark text) preceded by the rest of an open reasoning block."""
    try:
        parts = [dict(g) for g in json.loads(grammar)["grammars"]]
    except ValueError:  # Lark text, as grammar_from_lark gives it
        parts = [{"lark_grammar": grammar}]
    parts[0]["name"] = "answer"
    return json.dumps({"grammars": [{"lark_grammar": _REASONING}, *parts]})
