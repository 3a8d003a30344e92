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
  of type string (or without a type) is raw text up to ``\\n</parameter>``
  (holding none of the markers the parser ends a value at: ``</parameter>``,
  ``<parameter=``, ``</function>``) held to the schema's ``minLength``,
  ``maxLength`` (characters, as JSON Schema counts them) and ``pattern`` (a
  search, as JSON Schema's: anchored only by ``^``/``$``), an enum (or const)
  of scalars one of its values (strings as written, the rest as JSON), a
  type list with ``string`` raw text that never reads as one of its other
  types or else one of those as JSON (``["string", "null"]``: text, or
  ``null``; the numbers' bounds unenforced), any other value JSON valid under
  its schema: always as ``tool_call_xml.typed_value`` reads it back.
  What a raw value cannot hold (``format``, ``not``, ...; with ``lenient``, a
  ``pattern`` the library cannot express) is left unenforced and named in
  ``unenforced`` when the caller passes a list. Hermes arguments are one JSON object valid
  under the tool's ``parameters`` (after an optional space: the opener may
  end at ``"arguments":``).
- ``any_tool_call_grammar(tools, parser)``: the rest of a required call
  (any of ``tools``) after ``<tool_call>\\n``: the function's name, then its
  arguments as above; with ``several``, more such calls after it.
- ``regex_grammar(pattern)``, ``choice_grammar(choices)``, ``lark_grammar(text)``:
  output the whole of which ``pattern`` matches, output that is exactly one of
  ``choices`` (each a Lark string literal, JSON-escaped), output that llguidance's
  Lark ``text`` derives (vLLM's structured outputs, ``gateway/structured_outputs.py``).

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
from functools import lru_cache

try:
    import llguidance
except ImportError as e:  # a partial install: everything but constrained output still serves
    llguidance = None
    MISSING = f"the llguidance package cannot be imported ({e})"
else:
    MISSING = ""

from ignis.gateway.errors import ApiError
from ignis.gateway.tool_call_xml import scalar_values, schema_types, typed_value

JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,8}"
"""Whitespace allowed at each place JSON allows it: up to 8 spaces, newlines or tabs."""

JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE, "coerce_one_of": True}
"""llguidance's JSON options: bounded whitespace; ``oneOf`` held as ``anyOf`` (a value valid under one
branch is always allowed; the library has no exact ``oneOf``)."""
LENIENT_JSON = JSON_OPTIONS | {"lenient": True}
"""For a forced tool call whose schema uses what the library cannot hold (``not``, an unknown
``format``, ...): those keywords are left unenforced rather than the call refused."""

UNAVAILABLE_CODE = "structured_outputs_unavailable"


def _library():
    """llguidance, or a 400 saying constrained output cannot be had on this server (``MISSING``)."""
    if llguidance is None:
        raise ApiError(400, f"constrained output (response_format json_schema/json_object, structured_outputs, "
                            f"guided_*) is unavailable on this server: {MISSING}; install llguidance",
                       code=UNAVAILABLE_CODE)
    return llguidance


TOOL_PARSERS = ("xml", "hermes")
TOOL_PARSER_ALIASES = {"qwen3_xml": "xml"}  # --tool-call-parser's name of the XML format

# Raw text of an XML parameter: anything up to, and then including, the first "\n</parameter>\n", holding no
# marker the parser ends a value at (so the value the grammar counts is the one the parser reads), nor the
# block's close, where the splitter ends the call (``gateway.tool_call_split``).
_NO_MARKER = r"~/(.|\n)*(<\/parameter>|<parameter=|<\/function>|<\/tool_call>)(.|\n)*/"
_XML_TERMINALS = rf"""
RAW_TEXT: /(.|\n)*/ & {_NO_MARKER}
RAW_VALUE: RAW_TEXT "\n</parameter>\n"
"""
_CLOSE_PARAM = '"\\n</parameter>\\n"'
_RAW_UNENFORCED = ("format", "not", "if", "then", "else", "contentEncoding", "contentMediaType", "contentSchema",
                   "dependentSchemas", "dependentRequired")
"""Keywords that would constrain a raw XML value but are not held there: unenforced, and said so."""


# Text without a call's opener, and text up to and including the opener (one lexeme each, so the lexer
# never has to split free text where a call begins).
_FREE_TEXT = r"""
TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/
OPEN: /(.|\n)*/ & ~/(.|\n)*<tool_call>(.|\n)*/ "<tool_call>\n"
"""
_XML_ANY_PARAM = r"""
ANY_PARAM: "<parameter=" /[^\n>]+/ ">\n" RAW_VALUE
"""

_REASONING = r"""start: THOUGHT AFTER_THOUGHT @answer
THOUGHT: THOUGHT_TEXT "</think>"
THOUGHT_TEXT: /(.|\n)*/ & ~/(.|\n)*<\/think>(.|\n)*/
AFTER_THOUGHT: /\n{0,2}/
"""


def _with_options(schema: dict, options: dict = JSON_OPTIONS) -> dict:
    """``schema`` with ``options`` as llguidance's ``x-guidance`` (the schema's own win)."""
    return dict(schema, **{"x-guidance": options | dict(schema.get("x-guidance") or {})})


def json_schema_grammar(schema: dict | bool) -> str:
    """The grammar of one JSON value valid under ``schema`` (a JSON Schema object, or true)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    return _library().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)


def grammar_error(grammar: str) -> str:
    """The library's error for ``grammar``, or "" when it compiles (warnings are not errors)."""
    is_error, messages = _library().LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else ""


def grammar_warnings(grammar: str) -> list[str]:
    """The library's warnings for a grammar that compiles (with ``lenient``: each keyword it left unenforced,
    such as ``Unimplemented keys: ["not"]`` or ``Unknown format: zzz``)."""
    is_error, messages = _library().LLMatcher.validate_grammar_with_warnings(grammar)
    return [] if is_error else [m.strip() for m in messages]


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON escapes are Lark escapes


def _json_rule(schema: object, options: dict = JSON_OPTIONS) -> str:
    return "%json " + json.dumps(_with_options(schema if isinstance(schema, dict) else {}, options))


def _count(schema: dict, key: str) -> int | None:
    value = schema.get(key)
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if type(value) is int and value >= 0 else None


def _branches(regex: str) -> list[str]:
    """``regex`` split at its top-level ``|`` (outside groups, classes and escapes)."""
    out, depth, in_class, start, i = [], 0, 0, 0, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "[":
                in_class += 1
            elif c == "]":
                in_class -= 1
        elif c == "[":
            in_class = 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(regex[start:i])
            start = i + 1
        i += 1
    return out + [regex[start:]]


def _ends_with_anchor(branch: str) -> bool:
    """Whether ``branch`` ends with an unescaped ``$``."""
    if not branch.endswith("$"):
        return False
    slashes = len(branch) - 1 - len(branch[:-1].rstrip("\\"))
    return slashes % 2 == 0


def search_regex(pattern: str) -> str:
    """A Lark regex body (anchored, as Lark's are) of the texts JSON Schema's ``pattern`` finds a match in: each
    top-level branch anchored only where it starts with ``^`` or ends with ``$``. Raises ValueError when the
    pattern cannot be read."""
    lark = _library().regex_to_lark(pattern, "dw")  # JSON Schema's \\d and \\w are ASCII
    anything = r"(.|\n)*"
    parts = []
    for branch in _branches(lark):
        head = branch.startswith("^")
        tail = _ends_with_anchor(branch[1:] if head else branch)
        core = branch[1 if head else 0:len(branch) - 1 if tail else len(branch)]
        parts.append(("" if head else anything) + f"(?:{core})" + ("" if tail else anything))
    return "|".join(parts)


@lru_cache(maxsize=256)
def _search_regex_error(pattern: str) -> str:
    """Why the library cannot hold ``pattern`` as a raw value's search regex ("" when it can)."""
    try:
        regex = search_regex(pattern)
    except (ValueError, TypeError) as e:
        return str(e) or "it cannot be read"
    error = grammar_error(_library().LLMatcher.grammar_from_lark(f"start: T\nT: /{regex}/\n"))
    return error.splitlines()[0] if error else ""


class _Xml:
    """What an XML call's rules need beyond ``options``: terminals of held raw values, and notes of keywords left
    unenforced (``where: keyword``)."""

    def __init__(self, options: dict, unenforced: list[str] | None):
        self.options, self.lenient = options, bool(options.get("lenient"))
        self.terminals: list[str] = []
        self.unenforced = unenforced if unenforced is not None else []

    def raw(self, schema: dict, rule: str, where: str, excluded: tuple[str, ...] = ()) -> str:
        """The body of a raw value (and its closing) held to ``schema``'s length bounds and pattern, and never
        the JSON text of one of the ``excluded`` types (such text is that type's value to the parser)."""
        self.unenforced += [f"{where}: {k}" for k in _RAW_UNENFORCED if k in schema]
        low, high = _count(schema, "minLength"), _count(schema, "maxLength")
        pattern = schema.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise ValueError(f"{where}: pattern must be a string")
        error = _search_regex_error(pattern) if pattern is not None else ""
        if error and not self.lenient:
            raise ValueError(f"{where}: pattern {pattern!r} cannot be held: {error}")
        if error:
            self.unenforced.append(f"{where}: pattern")
            pattern = None
        if not low and high is None and pattern is None and not excluded:
            return "RAW_VALUE"
        text = [f"/(.|\\n){{{low or 0},{'' if high is None else high}}}/", _NO_MARKER]
        if pattern is not None:
            text.append(f"/{search_regex(pattern)}/")
        if excluded:
            forms = "|".join(_JSON_FORMS[k] for k in excluded)
            text.append(f"~/{_JSON_SPACE}({forms}){_JSON_SPACE}/")
        name = rule.upper()
        self.terminals += [f"{name}_TEXT: {' & '.join(text)}", f"{name}_VALUE: {name}_TEXT {_CLOSE_PARAM}"]
        return f"{name}_VALUE"


_STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType",
                    "contentSchema")
_JSON_SPACE = r"[ \t\n\r]*"
_JSON_FORMS = {
    "null": "null",
    "boolean": "true|false",
    "integer": r"-?(0|[1-9][0-9]*)",
    "number": r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    "object": r"\{(.|\n)*",
    "array": r"\[(.|\n)*",
}
"""The text, as a regex, that the parser reads as a value of each JSON type rather than as a string."""
_WRITTEN_NUMBERS = {
    "integer": r"-?(0|[1-9][0-9]{0,199})",
    "number": r"-?(0|[1-9][0-9]{0,199})(\.[0-9]{1,200})?([eE][+-]?[0-9]{1,2})?",
}
"""The numbers a type list lets the model write: at most 200 digits before the point and a two-digit exponent,
so each is a finite float or an int Python converts (a longer one would read back as a string the string's
own bounds never held; such text is neither a number nor a string there)."""
_SCALAR_TYPES = ("null", "boolean", "integer", "number")
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
"""A number's keywords that a type list with string leaves unenforced (its number is a plain JSON number)."""


def _xml_value(schema: object, xml: _Xml, rule: str, where: str) -> str:
    """The rule body of one parameter's value followed by its closing line, written as
    ``tool_call_xml.typed_value`` reads it back (``schema_types``)."""
    schema = schema if isinstance(schema, dict) else {}
    values = scalar_values(schema)
    if values is not None:
        # an enum (or const) of scalars: one of them, a string as itself, the rest as JSON; each written as the
        # parser reads it back as that value (an enum string "5" beside a number reads as 5, a value the
        # declared type does not allow reads as something else: such values cannot be written), and each
        # with its closing, so one value that begins another ("x", "x\n") is still whole
        types = schema_types(schema)
        written = [text for v in values
                   for text in [v if isinstance(v, str) else json.dumps(v)]
                   if json.dumps(typed_value(text, types)) == json.dumps(v)]
        if not written:
            raise ValueError(f"{where}: no value of its enum can be written in the XML format as itself")
        # one lexeme (the lexer's automaton), not a rule of alternatives: the parser keeps an item per
        # alternative that is still open, and gives up past 2,000 (an enum of that many sharing a prefix)
        name = f"{rule.upper()}_ENUM"
        xml.terminals.append(f"{name}: " + " | ".join(_lark_string(t + "\n</parameter>\n")
                                                      for t in dict.fromkeys(written)))
        return name
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "const")):
        return f"{_json_rule(schema, xml.options)} {_CLOSE_PARAM}"
    kind = schema.get("type")
    if kind in (None, "string"):
        return xml.raw(schema, rule, where)
    if isinstance(kind, list) and "string" in kind:
        # raw text for the string, JSON for the other types (["string", "null"]: OpenAI's strict optional
        # field; the bare word null is None); the string is never text that reads as one of the others
        others = tuple(dict.fromkeys(k for k in kind if k != "string"))
        if not others:
            return xml.raw(schema, rule, where)
        unknown = [k for k in others if k not in _JSON_FORMS]
        if unknown:
            raise ValueError(f"{where}: unknown type {unknown[0]!r}")
        options = [xml.raw(schema, rule, where, excluded=others)]
        scalars = [k for k in others if k in _SCALAR_TYPES]
        if scalars:
            # one lexeme with its closing: as a token of its own, "null" would lose to the raw text the lexer
            # still sees growing past it (the longest match wins)
            name = f"{rule.upper()}_SCALAR"
            forms = "|".join(_WRITTEN_NUMBERS.get(k, _JSON_FORMS[k]) for k in scalars)
            xml.terminals.append(f"{name}: /{forms}/ {_CLOSE_PARAM}")
            options.append(name)
            if {"integer", "number"} & set(scalars):
                xml.unenforced += [f"{where}: {k}" for k in _NUMBER_BOUNDS if k in schema]
        structured = [k for k in others if k not in _SCALAR_TYPES]
        if structured:  # the raw text never starts as an object or array does, so no lexeme races these
            rest = {k: v for k, v in schema.items() if k not in _STRING_KEYWORDS}
            rest["type"] = structured[0] if len(structured) == 1 else structured
            options.append(f"{_json_rule(rest, xml.options)} {_CLOSE_PARAM}")
        return f"({' | '.join(options)})"
    return f"{_json_rule(schema, xml.options)} {_CLOSE_PARAM}"


def _params(tool: object) -> tuple[str, dict]:
    """(name, parameters schema) of an OpenAI tool object (or of its ``function``)."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict):
        raise ValueError("a tool must be an object")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ValueError("function.parameters must be an object")
    name = fn.get("name")
    return (name if isinstance(name, str) else ""), params


def _xml_call(params: dict, prefix: str, xml: _Xml, tool: str = "") -> tuple[str, list[str]]:
    """(the rule body of a call's parameters and its closing, the rules it names) for ``<function=...>``."""
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise ValueError("parameters.properties must be an object")
    required = set(params.get("required") or ())
    defs = {key: params[key] for key in ("$defs", "definitions") if isinstance(params.get(key), dict)}
    rules, parts = [], []
    for k, (name, schema) in enumerate(props.items()):
        if "\n" in name or ">" in name:
            raise ValueError(f"parameter name {name!r} cannot appear in a <parameter=...> tag")
        if defs and isinstance(schema, dict) and '"$ref"' in json.dumps(schema):
            # each parameter is a schema of its own: the root's definitions go with it, so that a
            # "#/$defs/..." pointer (pydantic's, MCP tools') resolves in it
            schema = dict(schema, **{key: {**d, **(schema.get(key) or {})} for key, d in defs.items()})
        value = _xml_value(schema, xml, f"{prefix}{k}", f"{tool}.{name}" if tool else name)
        rules.append(f"{prefix}{k}: {_lark_string(f'<parameter={name}>' + chr(10))} {value}")
        parts.append(f"{prefix}{k}" if name in required else f"{prefix}{k}?")
    return " ".join(parts + ['"</function>\\n</tool_call>"']), rules


def _hermes_call(params: dict, options: dict) -> str:
    """The rule body of a call's arguments and its closing, after ``"arguments":``. Argument names are the
    schema's when it names its properties and says nothing of others (as the XML format's are)."""
    if isinstance(params, dict) and isinstance(params.get("properties"), dict) and not any(
            k in params for k in ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf",
                                  "anyOf", "oneOf", "$ref")):
        params = {**params, "additionalProperties": False}
    return f'" "? {_json_rule(params, options)} "}}\\n</tool_call>"'


def _parser(parser: str) -> str:
    parser = TOOL_PARSER_ALIASES.get(parser, parser)
    if parser not in TOOL_PARSERS:
        raise ValueError(f"tool parser must be one of {', '.join(TOOL_PARSERS)}, got {parser!r}")
    return parser


def tool_call_grammar(tool: dict, parser: str, lenient: bool = False, unenforced: list[str] | None = None) -> str:
    """The grammar of what follows the opener of a forced call of ``tool`` (an OpenAI tool object).

    ``parser``: "xml" (also "qwen3_xml"; Qwen3.5) or "hermes" (Qwen3-Next).
    The hermes opener may end with or without the space after
    ``"arguments":``. Raises ValueError for a tool whose parameters cannot be
    written in that format. ``lenient``: schema keywords the library cannot
    hold are left unenforced (``LENIENT_JSON``). ``unenforced``: a list that
    gets a ``where: keyword`` note for each keyword of an XML raw value that
    is not held (the library's own are its warnings: ``grammar_warnings``).
    """
    parser = _parser(parser)
    options = LENIENT_JSON if lenient else JSON_OPTIONS
    name, params = _params(tool)
    if parser == "xml":
        xml = _Xml(options, unenforced)
        body, rules = _xml_call(params, "p", xml, name)
        lark = "\n".join([f"start: {body}", *rules, *xml.terminals, _XML_TERMINALS])
    else:
        lark = f"start: {_hermes_call(params, options)}\n"
    return _library().LLMatcher.grammar_from_lark(lark)


def _call_rules(tools: list[dict], parser: str, options: dict, held: set[str] | None = None,
                unenforced: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(the call rules' names, every rule) of what follows ``<tool_call>\\n`` for each of ``tools``: the
    function's name, then its arguments held to its schema, or (a tool not in ``held``, when given) any
    arguments in the format's shape, with its closing."""
    calls, rules = [], []
    xml = _Xml(options, unenforced)
    for t, tool in enumerate(tools):
        name, params = _params(tool)
        if not name or (parser == "xml" and ("\n" in name or ">" in name)):
            raise ValueError(f"tool {t} has no name that can be written in a call")
        free = held is not None and name not in held
        if parser == "xml":
            if free:
                rules.append(f"call{t}: {_lark_string(f'<function={name}>' + chr(10))} ANY_PARAM* "
                             f'"</function>\\n</tool_call>"')
            else:
                body, params_rules = _xml_call(params, f"t{t}p", xml, name)
                rules += [f"call{t}: {_lark_string(f'<function={name}>' + chr(10))} {body}", *params_rules]
        else:
            head = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'
            args = {"type": "object"} if free else params
            rules.append(f"call{t}: {_lark_string(head)} {_hermes_call(args, options)}")
        calls.append(f"call{t}")
    return calls, rules + xml.terminals


def any_tool_call_grammar(tools: list[dict], parser: str, lenient: bool = False,
                          unenforced: list[str] | None = None, several: bool = False) -> str:
    """The grammar of what follows ``<tool_call>\\n`` when a call of one of ``tools`` is required.

    xml: ``<function=NAME>\\n`` and that tool's parameters; hermes:
    ``{"name": "NAME", "arguments": {...}}`` and the closing. ``several``: more
    calls may follow, each after ``\\n<tool_call>\\n`` (OpenAI's ``required`` is
    one call or more; with ``parallel_tool_calls: false`` it is one).
    """
    parser = _parser(parser)
    options = LENIENT_JSON if lenient else JSON_OPTIONS
    if not tools:
        raise ValueError("a required call needs at least one tool")
    calls, rules = _call_rules(tools, parser, options, unenforced=unenforced)
    terminals = [_XML_TERMINALS] if parser == "xml" else []
    start = ["start: call (NEXT_CALL call)*", "NEXT_CALL: \"\\n<tool_call>\\n\"", f"call: {' | '.join(calls)}"]
    if not several:
        start = [f"start: {' | '.join(calls)}"]
    return _library().LLMatcher.grammar_from_lark("\n".join([*start, *rules, *terminals]))


def tool_calls_grammar(tools: list[dict], parser: str, held: set[str], lenient: bool = False,
                       unenforced: list[str] | None = None) -> str:
    """The grammar of an answer the model may write as it likes, calls included, where each call is of
    one of ``tools`` (with ``allowed_tools``: the allowed ones) and a tool named in ``held`` (``strict:
    true``) has its arguments held to its schema; any other's are free in the format's shape. Text runs free up to ``<tool_call>\\n``; after a call more text or calls may follow."""
    parser = _parser(parser)
    options = LENIENT_JSON if lenient else JSON_OPTIONS
    if not tools:
        raise ValueError("tool calls need at least one tool")
    calls, rules = _call_rules(tools, parser, options, held, unenforced)
    lark = ["start: (OPEN call)* TEXT?", f"call: {' | '.join(calls)}", *rules, _FREE_TEXT]
    if parser == "xml":
        lark += [_XML_TERMINALS, _XML_ANY_PARAM]
    return _library().LLMatcher.grammar_from_lark("\n".join(lark))


def regex_grammar(pattern: str) -> str:
    """The grammar of text the whole of which ``pattern`` (Rust ``regex`` syntax) matches."""
    return _library().LLMatcher.grammar_from_regex(pattern)


def choice_grammar(choices: list[str]) -> str:
    """The grammar of exactly one of ``choices`` (any strings, the empty one included): the non-empty ones
    as one lexeme, which the lexer's automaton matches whatever their number (as alternatives of the rule,
    the parser gives up once more than 2,000 of them are open at once: 2,000 choices sharing a prefix)."""
    words = [c for c in dict.fromkeys(choices) if c]
    alternatives = (["CHOICE"] if words else []) + (['""'] if "" in choices else [])
    grammar = "start: " + " | ".join(alternatives) + "\n"
    if words:
        grammar += "CHOICE: " + " | ".join(_lark_string(c) for c in words) + "\n"
    return grammar


def lark_grammar(text: str) -> str:
    """The grammar ``text`` (llguidance's Lark syntax) states, read as Lark whatever it starts with."""
    return json.dumps({"grammars": [{"lark_grammar": text}]})


def after_reasoning(grammar: str) -> str:
    """``grammar`` (llguidance's JSON form, or Lark text) preceded by the rest of an open reasoning block."""
    try:
        parts = [dict(g) for g in json.loads(grammar)["grammars"]]
    except ValueError:  # Lark text, as grammar_from_lark gives it
        parts = [{"lark_grammar": grammar}]
    parts[0]["name"] = "answer"
    return json.dumps({"grammars": [{"lark_grammar": _REASONING}, *parts]})
