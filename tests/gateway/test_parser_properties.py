"""Property tests of the request parsers: any JSON body is parsed or refused with an ApiError, nothing else.

Bodies are drawn near the real shapes (the fields the parsers read, holding
values of every JSON type and plausible ones), so most draws get past the
first check and reach the deeper ones. A parser that lets a KeyError,
TypeError or ValueError escape would be a 500 on the wire.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import parse_messages, parse_tool_choice, parse_tools
from ignis.gateway.params import parse_common
from ignis.gateway.request_schemas import SAMPLING

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def near(shape: dict) -> st.SearchStrategy:
    """Objects holding some of ``shape``'s keys, each with its plausible value or any JSON value."""
    return st.fixed_dictionaries({}, optional={k: st.one_of(v, json_values) for k, v in shape.items()})


text_part = near({"type": st.sampled_from(["text", "image_url", "input_text"]), "text": st.text(max_size=8)})
tool_call = near({"id": st.text(max_size=8), "type": st.just("function"),
                  "function": near({"name": st.text(max_size=8), "arguments": st.sampled_from(["{}", "{\"a\": 1}", "x"])})})
message = near({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"]),
                "content": st.one_of(st.text(max_size=8), st.lists(text_part, max_size=3)),
                "tool_calls": st.lists(tool_call, max_size=2), "tool_call_id": st.text(max_size=8),
                "name": st.text(max_size=8), "reasoning_content": st.text(max_size=8)})
tool = near({"type": st.sampled_from(["function", "web_search"]),
             "function": near({"name": st.text(max_size=8), "description": st.text(max_size=8),
                               "parameters": st.just({"type": "object"}), "strict": st.booleans()})})
plausible = {name: scalars for name in SAMPLING} | {
    "messages": st.lists(message, max_size=4), "tools": st.lists(tool, max_size=2),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                             near({"type": st.just("function"), "function": near({"name": st.text(max_size=8)})})),
    "stream_options": near({"include_usage": st.booleans()}), "logprobs": scalars, "top_logprobs": scalars,
    "max_completion_tokens": scalars, "logit_bias": json_values, "best_of": scalars,
    "response_format": near({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"]),
                             "json_schema": near({"name": st.text(max_size=8), "schema": json_values})}),
}
schema = st.one_of(st.just({"type": "integer"}), st.sampled_from(['{"type": "object"}', "{", "[1]"]), json_values)
regex = st.one_of(st.sampled_from(["[0-9]{3}", "[0-9", "(?=a)", ""]), st.text(max_size=8))
choices = st.lists(st.text(max_size=6), max_size=3)
lark = st.one_of(st.sampled_from(['start: "a" | "b"', "start: foo", 'root ::= "a"', ""]), st.text(max_size=8))
plausible |= {"guided_json": schema, "guided_regex": regex, "guided_choice": choices, "guided_grammar": lark,
              "structured_outputs": near({"json": schema, "regex": regex, "choice": choices, "grammar": lark,
                                          "json_object": st.booleans(), "structural_tag": st.text(max_size=4)})}
bodies = near(plausible)


def parses_or_refuses(fn) -> None:
    try:
        fn()
    except ApiError as e:
        assert 400 <= e.status < 500 and e.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies, st.sampled_from(["chat", "completion"]))
def test_common_params_parse_or_refuse(body, kind):
    parses_or_refuses(lambda: parse_common(Fields(body), {}, kind))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_messages_tools_and_tool_choice_parse_or_refuse(body):
    f = Fields(body)
    parses_or_refuses(lambda: parse_messages(f))

    def tools_then_choice():
        parse_tool_choice(f, parse_tools(f))

    parses_or_refuses(tools_then_choice)
