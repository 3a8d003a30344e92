"""``response_format`` parsed into a grammar: the accepted forms, and a 400 naming the field for each bad one."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.response_format import _remembered, parse_response_format


def parse(fmt):
    return parse_response_format(Fields({"response_format": fmt}))


def test_text_or_nothing_is_no_grammar():
    assert parse(None) is None and parse({"type": "text"}) is None


def test_json_object_and_json_schema_become_json_schema_grammars():
    obj = json.loads(parse({"type": "json_object"}))["grammars"][0]["json_schema"]
    assert obj["type"] == "object"
    schema = {"type": "array", "items": {"type": "integer"}}
    got = json.loads(parse({"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}))
    assert {k: v for k, v in got["grammars"][0]["json_schema"].items() if k != "x-guidance"} == schema


@pytest.mark.parametrize("fmt,param,words", [
    ({}, "response_format.type", "required"),
    ({"type": "xml"}, "response_format.type", "must be one of"),
    ({"type": "json_schema"}, "response_format.json_schema", "required"),
    ({"type": "json_schema", "json_schema": {"name": "n"}}, "response_format.json_schema.schema", "required"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "response_format.json_schema.schema", "JSON Schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "response_format.json_schema.strict",
     "true or false"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "integr"}}}, "response_format.json_schema.schema",
     "integr"),
    ({"type": "json_schema", "json_schema": {"schema": {"propertyNames": {"maxLength": 2}}}},
     "response_format.json_schema.schema", "propertyNames"),
])
def test_bad_formats_are_400s_naming_the_field(fmt, param, words):
    with pytest.raises(ApiError) as e:
        parse(fmt)
    assert e.value.status == 400 and e.value.param == param and words in str(e.value)


def test_a_schema_sent_again_is_not_checked_again():
    fmt = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"zq": {"type": "null"}}}}}
    parse(fmt)
    hits = _remembered.cache_info().hits
    parse(fmt)
    assert _remembered.cache_info().hits == hits + 1
