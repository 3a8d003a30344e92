"""A tool's string parameters held to their schema's length bounds and pattern, in forced and strict calls.

In the XML format (Qwen3.5) a string value is raw text up to ``\\n</parameter>``,
not JSON, so the JSON Schema compiler never sees it: the grammar holds it to
``minLength``/``maxLength`` (characters) and ``pattern`` itself. Hermes
arguments are JSON, held by the library's compiler. Each case feeds a call
token by token on Qwen3.5's real vocabulary: a value at the bound goes
through, one character more is refused. What cannot be held (``format`` on a
raw value, a pattern the library cannot express) is left unenforced, counted,
and logged once per schema with the keyword named.
"""

from __future__ import annotations

import json
import logging

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.grammars import any_tool_call_grammar, tool_call_grammar, tool_calls_grammar
from ignis.gateway.output_parser import ForcedCall
from ignis.gateway.tool_call_xml import parse_xml_block, parameter_types
from ignis.gateway.tool_grammars import auto_calls_grammar, forced_call_grammar
from tests.gateway.tools_http_support import holds, vocab  # noqa: F401 (vocab: a fixture)

llguidance = pytest.importorskip("llguidance")


def tool(city: dict, name: str = "get_weather", **extra) -> dict:
    return {"type": "function", "function": {"name": name, **extra, "parameters": {
        "type": "object", "properties": {"city": city, "days": {"type": "integer"}}, "required": ["city"]}}}


SHORT = tool({"type": "string", "maxLength": 20}, strict=True)
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def xml_rest(city: str) -> str:
    """A named XML call's rest after its opener."""
    return f"<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"


def hermes_rest(city: str) -> str:
    return ' {"city": ' + '"' + city + '"}}\n</tool_call>'


REST = {"xml": xml_rest, "hermes": hermes_rest}


@pytest.mark.parametrize("parser", ["xml", "hermes"])
@pytest.mark.parametrize("city,ok", [("Paris", True), ("a" * 20, True), ("a" * 21, False), ("é" * 20, True),
                                     ("é" * 21, False), ("x" * 300, False), ("", True)])
def test_a_forced_calls_string_is_held_to_max_length(vocab, parser, city, ok):
    assert holds(vocab, tool_call_grammar(SHORT, parser), REST[parser](city)) is ok


@pytest.mark.parametrize("parser", ["xml", "hermes"])
def test_the_21st_character_is_refused_token_by_token(vocab, parser):
    """At 20 characters only the value's end may follow; a 21st character is not among the allowed tokens."""
    grammar = tool_call_grammar(SHORT, parser)
    head = "<parameter=city>\n" if parser == "xml" else ' {"city": "'
    matcher = llguidance.LLMatcher(vocab, grammar, log_level=0)
    ids = vocab.tokenize_str(head + "a" * 20, parse_special=True)
    assert matcher.try_consume_tokens(ids) == len(ids)
    assert not matcher.validate_tokens(vocab.tokenize_str("a", parse_special=True))
    end = "\n" if parser == "xml" else '"'
    assert matcher.validate_tokens(vocab.tokenize_str(end, parse_special=True))


@pytest.mark.parametrize("parser", ["xml", "hermes"])
def test_required_and_strict_auto_calls_hold_max_length_too(vocab, parser):
    def call(city: str) -> str:
        if parser == "xml":
            return "<function=get_weather>\n" + xml_rest(city)
        return '{"name": "get_weather", "arguments": {"city": "' + city + '"}}\n</tool_call>'

    required = any_tool_call_grammar([SHORT, CLOCK], parser)
    assert holds(vocab, required, call("a" * 20)) and not holds(vocab, required, call("a" * 21))
    auto = tool_calls_grammar([SHORT, CLOCK], parser, {"get_weather"})
    assert holds(vocab, auto, "Let me look.\n<tool_call>\n" + call("a" * 20))
    assert not holds(vocab, auto, "Let me look.\n<tool_call>\n" + call("a" * 21))
    free = tool_calls_grammar([SHORT, CLOCK], parser, set())  # not strict: not held
    assert holds(vocab, free, "<tool_call>\n" + call("a" * 21))


@pytest.mark.parametrize("parser", ["xml", "hermes"])
@pytest.mark.parametrize("city,ok", [("Rome", True), ("Ro", False), ("a\nb", True), ("a" * 8, True)])
def test_min_length_is_held(vocab, parser, city, ok):
    if parser == "hermes":
        city = city.replace("\n", "\\n")
    grammar = tool_call_grammar(tool({"type": "string", "minLength": 3, "maxLength": 8}), parser)
    assert holds(vocab, grammar, REST[parser](city)) is ok


@pytest.mark.parametrize("parser", ["xml", "hermes"])
@pytest.mark.parametrize("pattern,city,ok", [
    (r"^[A-Z][a-z]+$", "Paris", True),
    (r"^[A-Z][a-z]+$", "paris", False),
    (r"^[A-Z][a-z]+$", "Paris2", False),
    (r"\d", "Area 51", True),  # a search: the match may be anywhere
    (r"\d", "Area", False),
    (r"^a|b$", "ax", True),
    (r"^a|b$", "xb", True),
    (r"^a|b$", "xa", False),
    (r"^\w+/\w+$", "Europe/Paris", True),
    (r"^\w+/\w+$", "Europe Paris", False),
])
def test_pattern_is_held_as_a_search(vocab, parser, pattern, city, ok):
    grammar = tool_call_grammar(tool({"type": "string", "pattern": pattern}), parser)
    assert holds(vocab, grammar, REST[parser](city)) is ok


def test_an_xml_value_holds_no_marker_the_parser_would_end_it_at(vocab):
    """The grammar's value is the one the parser reads, so a bound counts what the client gets."""
    grammar = tool_call_grammar(SHORT, "xml")
    for city in ("a</parameter>b", "a<parameter=days>", "a</function>"):
        assert not holds(vocab, grammar, xml_rest(city)), city
    text = xml_rest("Saint <b>Malo</b>")
    assert holds(vocab, grammar, text)
    assert parse_xml_block("<function=get_weather>\n" + text.removesuffix("</tool_call>"),
                           parameter_types([SHORT])) == ("get_weather", '{"city": "Saint <b>Malo</b>"}')


def test_a_string_const_is_a_literal_in_xml(vocab):
    grammar = tool_call_grammar(tool({"type": "string", "const": "Oslo"}), "xml")
    assert holds(vocab, grammar, xml_rest("Oslo"))
    assert not holds(vocab, grammar, xml_rest('"Oslo"')) and not holds(vocab, grammar, xml_rest("Rome"))


def test_a_nullable_string_is_raw_text_and_parses_without_quotes(vocab):
    # OpenAI's strict schemas make an optional field ["string", "null"]: a quoted JSON value would reach the
    # client with its quotes, since the parser reads a string-typed value as written
    nullable = tool({"type": ["string", "null"], "maxLength": 20}, strict=True)
    grammar = tool_call_grammar(nullable, "xml")
    for city, value in (("Paris", "Paris"), ("null", None)):
        assert holds(vocab, grammar, xml_rest(city))
        text = "<function=get_weather>\n" + xml_rest(city).removesuffix("</tool_call>")
        assert parse_xml_block(text, parameter_types([nullable])) == ("get_weather", json.dumps({"city": value}))
    assert not holds(vocab, grammar, xml_rest("a" * 21))


def _parsed(schema: dict, city: str) -> object:
    text = "<function=get_weather>\n" + xml_rest(city).removesuffix("</tool_call>")
    name, args = parse_xml_block(text, parameter_types([tool(schema)]))
    return json.loads(args)["city"]


REFUSED = object()


@pytest.mark.parametrize("schema,cases", [
    # a type list with string and others: raw text for the string, JSON for the rest; the string is never
    # text that reads as one of the others, so the value the parser gives is valid under the schema
    ({"type": ["integer", "string"], "maxLength": 3}, [(")==", ")=="), ("5", 5), ("-12", -12), ("abc", "abc"),
                                                      ('"5"', '"5"'), ("1234", 1234), ("abcd", REFUSED)]),
    ({"type": ["string", "integer"]}, [("10", 10), ("ten", "ten"), ("1.5", "1.5"), (" 10", REFUSED)]),
    ({"type": ["string", "null"], "maxLength": 2}, [("null", None), ("ab", "ab"), (" null", REFUSED),
                                                    ("abc", REFUSED)]),
    ({"type": ["number", "string", "null"]}, [("2.5e3", 2500.0), ("null", None), ("NaN", "NaN"), ("x y", "x y"),
                                              ("true", "true")]),
    ({"type": ["boolean", "string"]}, [("true", True), ("false", False), ("True", "True")]),
    ({"type": ["array", "string"]}, [("[1, 2]", [1, 2]), ("[1, 2", REFUSED), ("note [1]", "note [1]")]),
])
def test_a_type_list_with_string_writes_what_the_parser_reads_as_valid(vocab, schema, cases):
    grammar = tool_call_grammar(tool(schema, strict=True), "xml")
    for city, value in cases:
        if value is REFUSED:
            assert not holds(vocab, grammar, xml_rest(city)), city
            continue
        assert holds(vocab, grammar, xml_rest(city)), city
        assert _parsed(schema, city) == value, city


def test_a_type_lists_number_bounds_are_named_unenforced():
    notes: list[str] = []
    tool_call_grammar(tool({"type": ["integer", "string"], "maximum": 10}), "xml", unenforced=notes)
    assert notes == ["get_weather.city: maximum"]


@pytest.mark.parametrize("schema,allowed,refused", [
    ({"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
     {"celsius": "celsius", "null": None}, ["kelvin", '"celsius"', ""]),
    ({"enum": ["low", 1, 2]}, {"low": "low", "1": 1, "2": 2}, ["3", '"low"', "high"]),  # pydantic's Literal["low", 1, 2]
    ({"enum": ["1", "2"]}, {"1": "1", "2": "2"}, ["3"]),  # strings that look like numbers stay strings
    ({"const": 7}, {"7": 7}, ["8", '"7"']),
    ({"type": "boolean", "enum": [True]}, {"true": True}, ["false"]),
])
def test_an_enum_of_any_scalars_is_one_of_its_values_in_xml(vocab, schema, allowed, refused):
    grammar = tool_call_grammar(tool(schema, strict=True), "xml")
    for city, value in allowed.items():
        assert holds(vocab, grammar, xml_rest(city)), city
        assert _parsed(schema, city) == value, city
    for city in refused:
        assert not holds(vocab, grammar, xml_rest(city)), city


@pytest.mark.parametrize("schema,refused,allowed", [
    # an enum string that reads back as another allowed type cannot be written as itself: left out
    ({"enum": ["5", 6]}, ["5"], {"6": 6}),
    ({"enum": ["true", False]}, ["true"], {"false": False}),
    ({"type": ["string", "null"], "enum": ["null", "a"]}, ["null"], {"a": "a"}),
    ({"type": ["string", "integer"], "enum": ["5", "x"]}, ["5"], {"x": "x"}),
    ({"type": "string", "enum": ["a", 1]}, ["1"], {"a": "a"}),  # 1 is not a string: the type rules it out
    ({"enum": ["x", "x\n"]}, [], {"x": "x", "x\n": "x\n"}),  # one value beginning another: both whole
])
def test_enum_values_are_written_only_as_the_parser_reads_them_back(vocab, schema, refused, allowed):
    jsonschema = pytest.importorskip("jsonschema")
    grammar = tool_call_grammar(tool(schema, strict=True), "xml")
    for city in refused:
        assert not holds(vocab, grammar, xml_rest(city)), city
    for city, value in allowed.items():
        assert holds(vocab, grammar, xml_rest(city)), city
        assert _parsed(schema, city) == value
        jsonschema.validate(value, schema)


def test_an_enum_that_cannot_be_written_is_a_clear_error():
    with pytest.raises(ValueError, match="no value of its enum"):
        tool_call_grammar(tool({"type": ["string", "integer"], "enum": ["5"]}), "xml")


@pytest.mark.parametrize("city", ["1e400", "1" * 250, "-" + "9" * 5000, "1e999"])
def test_a_type_lists_number_is_finite_and_convertible(vocab, city):
    """Under a type list with string, a number that would overflow (or that Python will not convert) is neither
    a number nor a string: it would read back as a string the string's bounds never held."""
    grammar = tool_call_grammar(tool({"type": ["number", "string"], "maxLength": 3}, strict=True), "xml")
    assert not holds(vocab, grammar, xml_rest(city))
    assert holds(vocab, grammar, xml_rest("9" * 199 + "e99"))


def test_nan_and_infinity_are_never_numbers_in_arguments():
    """JSON has no NaN or Infinity: a number parameter written so stays text, and the arguments stay JSON."""
    for city in ("NaN", "Infinity", "-Infinity", "1e999"):
        value = _parsed({"type": "number"}, city)
        assert value == city


class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1


class Metrics:
    def __init__(self):
        self.grammar_lenient = Counter()


def lenient_logs(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "held leniently" in r.getMessage()]


@pytest.mark.parametrize("parser", ["xml", "hermes"])
def test_an_unenforced_keyword_is_logged_once_per_schema_with_its_name_and_counted(vocab, parser, caplog):
    odd = tool({"type": "string", "format": f"zzz-{parser}", "maxLength": 20}, name="odd")
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="ignis.gateway"):
        for _ in range(3):
            grammar = forced_call_grammar(ForcedCall("odd"), [odd], parser, metrics)
    assert metrics.grammar_lenient.n == 3  # counted each time
    logs = lenient_logs(caplog)
    assert len(logs) == 1 and "format" in logs[0], logs  # logged once, naming the keyword
    rest = REST[parser]
    assert holds(vocab, grammar, rest("a" * 20)) and not holds(vocab, grammar, rest("a" * 21))  # the rest is held


def test_a_strict_auto_tools_unenforced_keyword_is_logged_once_and_a_plain_schema_is_not(vocab, caplog):
    odd = tool({"type": "string", "format": "email", "not": {"const": "x"}}, name="mail", strict=True)
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="ignis.gateway"):
        auto_calls_grammar([odd, CLOCK], "xml", metrics)
        auto_calls_grammar([odd, CLOCK], "xml", metrics)
        forced_call_grammar(ForcedCall("get_weather"), [SHORT], "xml", metrics)
    logs = lenient_logs(caplog)
    assert len(logs) == 1 and "mail.city: format" in logs[0] and "mail.city: not" in logs[0], logs
    assert metrics.grammar_lenient.n == 2


def test_a_pattern_the_library_cannot_express_is_lenient_in_xml_and_refused_in_hermes(vocab, caplog):
    look = tool({"type": "string", "pattern": "^a(?=b)", "maxLength": 5}, name="look")
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="ignis.gateway"):
        grammar = forced_call_grammar(ForcedCall("look"), [look], "xml", metrics)
    logs = lenient_logs(caplog)
    assert len(logs) == 1 and "look.city: pattern" in logs[0], logs
    assert holds(vocab, grammar, xml_rest("zz")) and not holds(vocab, grammar, xml_rest("a" * 6))
    with pytest.raises(ApiError, match="look-around"):
        forced_call_grammar(ForcedCall("look"), [look], "hermes", metrics)


# ----- through HTTP: the grammar the engine is sent (Qwen3.5's template, a scripted engine) -----------------


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from tests.gateway.tools_http_support import tools_gateway

    yield from tools_gateway(tmp_path_factory, "qwen3_5", tools=[SHORT, CLOCK],
                             messages=[{"role": "user", "content": "Weather in Paris?"}])


def test_a_required_call_and_a_strict_auto_call_are_sent_with_max_length_held(gw, vocab):
    from tests.gateway.tools_http_support import create

    with gw.client() as client:
        r = create(gw, client, "<function=get_weather>\n" + xml_rest("Paris"), tool_choice="required")
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris"}'
        required = gw.engine.generates[-1].grammar
        create(gw, client, "Let me look.\n<tool_call>\n<function=get_weather>\n" + xml_rest("Paris"))
        auto = gw.engine.generates[-1].grammar
    opened = "<function=get_weather>\n"
    assert holds(vocab, required, opened + xml_rest("a" * 20))
    assert not holds(vocab, required, opened + xml_rest("a" * 21))
    thought = "Looking.</think>\n\n<tool_call>\n" + opened
    assert holds(vocab, auto, thought + xml_rest("a" * 20))
    assert not holds(vocab, auto, thought + xml_rest("a" * 21))


def test_required_is_one_call_or_more_unless_parallel_calls_are_off(gw, vocab):
    """OpenAI's and vLLM's ``required``: at least one call; ``parallel_tool_calls: false``: exactly one."""
    from tests.gateway.tools_http_support import create

    opened = "<function=get_weather>\n"
    two = opened + xml_rest("Paris") + "\n<tool_call>\n" + opened + xml_rest("Oslo")
    with gw.client() as client:
        r = create(gw, client, two, tool_choice="required")
        several = gw.engine.generates[-1].grammar
        create(gw, client, opened + xml_rest("Paris"), tool_choice="required", parallel_tool_calls=False)
        single = gw.engine.generates[-1].grammar
    calls = r.choices[0].message.tool_calls
    assert [c.function.arguments for c in calls] == ['{"city": "Paris"}', '{"city": "Oslo"}']
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    assert holds(vocab, several, two) and holds(vocab, several, opened + xml_rest("Paris"))
    assert not holds(vocab, several, two + "\nDone.")
    assert holds(vocab, single, opened + xml_rest("Paris")) and not holds(vocab, single, two)



def test_a_required_hermes_call_may_be_followed_by_more(vocab):
    first = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    second = '{"name": "get_time", "arguments": {}}\n</tool_call>'
    several = any_tool_call_grammar([SHORT, CLOCK], "hermes", several=True)
    single = any_tool_call_grammar([SHORT, CLOCK], "hermes")
    both = first + "\n<tool_call>\n" + second
    assert holds(vocab, several, first) and holds(vocab, several, both)
    assert holds(vocab, single, first) and not holds(vocab, single, both)
