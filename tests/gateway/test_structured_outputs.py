"""Structured outputs over HTTP: response_format json_schema / json_object, and vLLM's structured_outputs /
guided_* (choice, regex, json), on a model with Qwen's real vocabulary.

A tiny random checkpoint (weights random, tokenizer and template real) is
served by ``ignis serve``; the openai client asks for JSON. At temperature 1
a random model draws from everything the grammar allows, so every output
valid under the schema is the grammar's work. Schemas bound their strings and
numbers so a random model finishes well inside max_tokens.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.support.real_tokenizer import token_ids

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "temp": {"type": "integer", "minimum": -50, "maximum": 60},
    "sky": {"enum": ["clear", "cloudy", "rain"]},
    "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 3}},
    "required": ["city", "temp", "sky", "hours"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "The weather in Paris, as JSON."}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def served(real_checkpoint, tmp_path_factory):
    path = real_checkpoint("qwen3_5").path
    s = start_serve(tmp_path_factory.mktemp("structured"), ["--model", str(path), "--kv-pool-tokens", "8192",
                                                            "--decode-lanes", "8", "--api-key", API_KEY])
    yield s
    assert stop_serve(s) == 0, s.log()


@pytest.fixture
def client(served):
    from openai import OpenAI

    with OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}


def test_twenty_outputs_at_temperature_one_all_validate(client, served):
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=4, max_tokens=400,
                                       seed=7, response_format=schema_format(SCHEMA), extra_body=NO_THINKING)
    outputs = [(c.message.content, c.finish_reason) for c in r.choices]
    with ThreadPoolExecutor(4) as pool:  # the rest as concurrent requests: batched with one another
        for rr in pool.map(lambda i: client.chat.completions.create(
                model=served.model, messages=MESSAGES, temperature=1.0, n=4, max_tokens=400, seed=100 + i,
                response_format=schema_format(SCHEMA), extra_body=NO_THINKING), range(4)):
            outputs += [(c.message.content, c.finish_reason) for c in rr.choices]
    assert len(outputs) == 20
    for text, finish in outputs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_outputs_parse_as_objects(client, served):
    # json_object bounds nothing: a random model's keys and strings end only when it happens to draw a quote,
    # so some choices run to max_tokens. Those are still what the grammar allowed; the ones that end parse.
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=8, seed=11,
                                       max_tokens=60, response_format={"type": "json_object"}, extra_body=NO_THINKING)
    ended = [c.message.content for c in r.choices if c.finish_reason == "stop"]
    assert ended, [(c.finish_reason, c.message.content) for c in r.choices]
    for text in ended:
        assert isinstance(json.loads(text), dict)
    for c in r.choices:
        assert c.finish_reason in ("stop", "length") and c.message.content.startswith("{")


def test_an_invalid_schema_is_a_400_naming_the_problem_and_the_next_request_is_served(client, served):
    import openai

    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=10,
                                       response_format=schema_format(bad), extra_body=NO_THINKING)
    err = e.value.body
    assert err["param"] == "response_format.json_schema.schema"
    assert "missing" in err["message"]
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, max_tokens=40,
                                       response_format=schema_format({"type": "boolean"}), extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "stop" and json.loads(r.choices[0].message.content) in (True, False)


def test_completions_take_a_response_format_too(client, served):
    r = client.completions.create(model=served.model, prompt="Answer:", temperature=1.0, max_tokens=30, seed=1,
                                  extra_body={"response_format": schema_format({"enum": ["yes", "no"]})})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].text) in ("yes", "no")


def test_with_thinking_the_reasoning_runs_free_before_the_json(client, served):
    # The template opens <think>: a random model never closes it within 12 tokens, so all of it is reasoning,
    # drawn from the whole vocabulary rather than from what a JSON value allows.
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, seed=5, max_tokens=12,
                                       response_format=schema_format(SCHEMA),
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert choice.message.model_extra["reasoning_content"]
    assert not choice.message.model_extra["reasoning_content"].lstrip().startswith("{")


# vLLM's structured-output fields (gateway/structured_outputs.py): the same grammar path, other shapes.

CHOICES = ["positive", "negative", 'neutral, "mostly"\n']
CODE = r"[0-9]{3}-[a-z]{2}"


def test_a_choice_request_answers_exactly_one_of_the_choices(client, served):
    extra = NO_THINKING | {"structured_outputs": {"choice": CHOICES}}
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=8, seed=3,
                                       max_tokens=40, extra_body=extra)
    rc = client.completions.create(model=served.model, prompt="Sentiment:", temperature=1.0, n=4, seed=4,
                                   max_tokens=40, extra_body={"guided_choice": CHOICES})
    outputs = [(c.message.content, c.finish_reason) for c in r.choices]
    outputs += [(c.text, c.finish_reason) for c in rc.choices]
    for text, finish in outputs:
        assert finish == "stop" and text in CHOICES, (text, finish)


def test_a_regex_request_answers_text_the_whole_regex_matches(client, served):
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=8, seed=9,
                                       max_tokens=30, extra_body=NO_THINKING | {"guided_regex": CODE})
    stream = client.completions.create(model=served.model, prompt="Code:", temperature=1.0, seed=10, max_tokens=30,
                                       stream=True, extra_body={"structured_outputs": {"regex": CODE}})
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    for text in [c.message.content for c in r.choices] + [streamed]:
        assert re.fullmatch(CODE, text), text
    assert all(c.finish_reason == "stop" for c in r.choices)


def test_a_guided_json_output_parses_and_validates(client, served):
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=4, seed=12,
                                       max_tokens=400, extra_body=NO_THINKING | {"guided_json": json.dumps(SCHEMA)})
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_a_bad_regex_is_a_400_naming_the_field_and_the_next_request_is_served(client, served):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=10,
                                       extra_body=NO_THINKING | {"structured_outputs": {"regex": "[0-9]{3"}})
    err = e.value.body
    assert err["param"] == "structured_outputs.regex" and "regex" in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=10,
                                       extra_body=NO_THINKING | {"guided_regex": "a", "guided_choice": ["a"]})
    assert e.value.body["param"] == "guided_choice" and "guided_regex and guided_choice" in e.value.body["message"]
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, max_tokens=20,
                                       extra_body=NO_THINKING | {"guided_regex": CODE})
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(CODE, r.choices[0].message.content)


def test_with_thinking_the_choice_is_the_answer_after_the_reasoning_block(client, served):
    # A bias on </think> makes the random model close its reasoning at once; the grammar then holds the
    # answer, which arrives as content. Were the grammar to hold the reasoning too, </think> could never
    # be drawn and everything would stay reasoning_content.
    think_end = token_ids("qwen3_5")["</think>"]
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=1.0, n=4, seed=5,
                                       max_tokens=40, logit_bias={str(think_end): 100},
                                       extra_body={"guided_choice": CHOICES,
                                                   "chat_template_kwargs": {"enable_thinking": True}})
    for c in r.choices:
        assert c.finish_reason == "stop" and c.message.content.strip() in [x.strip() for x in CHOICES], c.message


def test_a_grammar_that_allows_nothing_is_a_400_and_one_that_fails_mid_output_an_error(client, served):
    # The library builds its lexer lazily: an empty language fails at the first mask (refused before any
    # token), a regex of a million repeats when the lexer grows past its bound after the first token. Either
    # was answered 200 "stop" with text outside the grammar.
    import openai

    for extra in ({"guided_regex": "[^\\s\\S]"}, {"guided_grammar": "start: start"},
                  {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=10,
                                           extra_body=NO_THINKING | extra)
        assert "allows no output" in e.value.body["message"], e.value.body
    for stream in (False, True):
        with pytest.raises(openai.APIError) as e:
            r = client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=30, temperature=0,
                                               stream=stream, extra_body=NO_THINKING | {"guided_regex": "(a{1000}){1000}"})
            if stream:
                list(r)
        assert "the grammar failed" in str(e.value), e.value
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, max_tokens=20,
                                       extra_body=NO_THINKING | {"guided_regex": CODE})
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(CODE, r.choices[0].message.content)


def test_a_grammar_beside_allowed_token_ids_that_allow_none_of_its_tokens_is_a_client_error(client, served):
    """The engine finds at the first step that the request's own constraints leave no token: a 400 (a 500
    made SDKs retry a request that cannot succeed), and in a stream an error event of the same kind."""
    import openai

    extra = NO_THINKING | {"structured_outputs": {"choice": ["yes", "no"]}, "allowed_token_ids": [7]}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=5, extra_body=extra)
    assert e.value.body["code"] == "invalid_request" and "leave no token" in e.value.body["message"], e.value.body
    with pytest.raises(openai.APIError) as e:
        list(client.chat.completions.create(model=served.model, messages=MESSAGES, max_tokens=5, stream=True,
                                            extra_body=extra))
    assert "leave no token" in str(e.value), e.value
    r = client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, max_tokens=5,
                                       extra_body=NO_THINKING | {"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in ("yes", "no")
