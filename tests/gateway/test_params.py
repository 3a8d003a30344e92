"""Request field parsing: defaults, OpenAI and vLLM spellings, seeds per choice, request class."""

from __future__ import annotations

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.messages import last_is_user, parse_messages
from ignis.gateway.params import parse_common, sampling_for


def common(kind="chat", headers=None, **body):
    return parse_common(Fields(body), headers or {}, kind)


def test_defaults():
    p = common()
    assert (p.n, p.stream, p.temperature, p.top_p, p.top_k, p.max_tokens) == (1, False, 1.0, 1.0, 0, None)
    assert p.request_class == "interactive" and p.stops == () and not p.include_usage


def test_max_completion_tokens_wins_in_chat_and_top_k_minus_one_is_off():
    p = common(max_tokens=5, max_completion_tokens=7, top_k=-1)
    assert p.max_tokens == 7 and p.top_k == 0
    assert common("completion", max_tokens=5, max_completion_tokens=7).max_tokens == 5


def test_seed_per_choice():
    p = common(seed=2**63 - 1, n=2)
    assert sampling_for(p, 4, 0).seed == 2**63 - 1 and sampling_for(p, 4, 1).seed == 0
    assert sampling_for(common(), 4, 3).seed is None


def test_stop_forms_and_logprobs_forms():
    assert common(stop="x").stops == ("x",) and common(stop=["a", "b"]).stops == ("a", "b")
    until = ["\n\n", "Q:", "</s>", "<|im_end|>", "Question:", "Problem:"]  # lm-eval's until lists run past 4
    assert common(stop=until).stops == tuple(until)
    chat = common(logprobs=True, top_logprobs=3)
    assert (chat.logprobs, chat.top_logprobs) == (True, 3)
    legacy = common("completion", logprobs=2)
    assert (legacy.logprobs, legacy.top_logprobs) == (True, 2)
    assert not common("completion").logprobs


def test_nulls_are_absent_and_integral_floats_are_integers():
    p = common(max_tokens=None, temperature=None, n=2.0)
    assert p.max_tokens is None and p.temperature == 1.0 and p.n == 2


def test_request_class_body_then_header():
    assert common(headers={"X-Ignis-Request-Class": "Agent"}).request_class == "agent"
    assert common(headers={"X-Ignis-Request-Class": "agent"}, priority="interactive").request_class == "interactive"
    assert common(request_class="agent").request_class == "agent"
    # vLLM's integer priority (lower is served first; 0 its default)
    assert [common(priority=v).request_class for v in (-5, 0, 3)] == ["interactive", "interactive", "agent"]
    assert common(headers={"X-Ignis-Request-Class": "agent"}, priority=0).request_class == "interactive"
    for bad in ("urgent", 1.5, True):
        with pytest.raises(ApiError) as e:
            common(priority=bad)
        assert e.value.param == "priority"


def test_prompt_cache_key_becomes_a_family_digest_scoped_to_the_caller():
    a = common(prompt_cache_key="session-1").cache_family
    assert a is not None and len(a) == 32 and "session-1" not in a
    assert common(prompt_cache_key="session-1").cache_family == a
    assert common(prompt_cache_key="session-2").cache_family != a
    assert common(headers={"Authorization": "Bearer other"}, prompt_cache_key="session-1").cache_family != a
    assert common().cache_family is None and common(prompt_cache_key="").cache_family is None
    for bad in (7, "k" * 1025):
        with pytest.raises(ApiError) as e:
            common(prompt_cache_key=bad)
        assert e.value.param == "prompt_cache_key"


def test_cache_salt_becomes_a_digest_and_an_empty_or_bad_one_is_a_400():
    a = common(cache_salt="secret-1").cache_salt
    assert a is not None and len(a) == 64 and "secret-1" not in a
    assert common(cache_salt="secret-1").cache_salt == a
    assert common(cache_salt="secret-2").cache_salt != a
    assert common(headers={"Authorization": "Bearer other"}, cache_salt="secret-1").cache_salt == a
    assert common().cache_salt is None
    for bad in ("", 7, ["s"], "s" * 4097):
        with pytest.raises(ApiError) as e:
            common(cache_salt=bad)
        assert e.value.param == "cache_salt"


def test_messages_keep_only_what_templates_read():
    msgs = parse_messages(Fields({"messages": [
        {"role": "user", "content": "q", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1]}"}}],
         "reasoning": "r"},
        {"role": "tool", "content": "out", "tool_call_id": "c1"}]}))
    assert msgs[0] == {"role": "user", "content": "q", "name": "bob"}
    assert msgs[1] == {"role": "assistant", "reasoning_content": "r", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": [1]}}, "id": "c1"}]}
    assert msgs[2] == {"role": "tool", "content": "out", "tool_call_id": "c1"}
    assert not last_is_user(msgs)
    wrapped = [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}]
    assert not last_is_user(wrapped) and last_is_user([{"role": "user", "content": "hi"}])


def test_logit_bias_becomes_ascending_pairs_and_min_tokens_passes_on():
    p = common(logit_bias={"17": 5, "3": -100, " 9": 0.5}, min_tokens=2, max_tokens=4)
    assert p.logit_bias == ((3, -100.0), (9, 0.5), (17, 5.0)) and p.min_tokens == 2
    s = sampling_for(p, 4, 0)
    assert s.logit_bias == p.logit_bias and s.min_tokens == 2
    assert sampling_for(common(min_tokens=50), 10, 0).min_tokens == 10  # the default max_tokens caps it
    assert common(logit_bias={}).logit_bias == ()
    assert p.for_vocabulary(Fields({}), 18) is p
    with pytest.raises(ApiError, match="token id 17 is outside the vocabulary"):
        p.for_vocabulary(Fields({}), 17)
    with pytest.raises(ApiError, match="token id 40 is outside the vocabulary"):
        common(stop_token_ids=[3, 40]).for_vocabulary(Fields({}), 40)
    assert common(top_k=2**40).for_vocabulary(Fields({}), 40).top_k == 0
    assert common(top_k=39).for_vocabulary(Fields({}), 40).top_k == 39


@pytest.mark.parametrize("body, match", [
    (dict(logit_bias=[[1, 2]]), "must be an object"),
    (dict(logit_bias={"a": 1}), "keys must be token ids"),
    (dict(logit_bias={"-1": 1}), "keys must be token ids"),
    (dict(logit_bias={"1": 101}), r"must be a number in \[-100, 100\]"),
    (dict(logit_bias={"1": "5"}), r"must be a number in \[-100, 100\]"),
    (dict(logit_bias={"1": True}), r"must be a number in \[-100, 100\]"),
    (dict(logit_bias={"01": 1, "1": 2}), "given twice"),
    (dict(logit_bias={str(i): 1 for i in range(1025)}), "at most 1024"),
    (dict(min_tokens=-1), "at least 0"),
    (dict(min_tokens=5, max_tokens=4), "at most max_tokens"),
    (dict(min_tokens=1, response_format={"type": "json_object"}), "cannot be combined"),
])
def test_bad_logit_bias_and_min_tokens_are_refused(body, match):
    with pytest.raises(ApiError, match=match):
        common(**body)


def test_vllm_output_flags_and_bad_words_are_read():
    p = common(include_stop_str_in_output=True, return_tokens_as_token_ids=True, bad_words=[" hello", "x y"])
    assert p.include_stop_str_in_output and p.return_tokens_as_token_ids
    assert p.bad_words == (" hello", "x y") and p.bad_word_ids == ()  # tokenized once the model is known
    plain = common()
    assert not plain.include_stop_str_in_output and not plain.return_tokens_as_token_ids and plain.bad_words == ()
    assert sampling_for(plain, 4, 0).bad_words == ()


@pytest.mark.parametrize("body, param", [
    (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output"),
    (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
    (dict(return_tokens_as_token_ids="true"), "return_tokens_as_token_ids"),
    (dict(return_tokens_as_token_ids=[True]), "return_tokens_as_token_ids"),
    (dict(bad_words="hello"), "bad_words"),
    (dict(bad_words={"hello": 1}), "bad_words"),
    (dict(bad_words=[1]), "bad_words"),
    (dict(bad_words=[["hello"]]), "bad_words"),
    (dict(bad_words=[""]), "bad_words"),
    (dict(bad_words=[" \n"]), "bad_words"),
    (dict(bad_words=["x" * 1001]), "bad_words"),
    (dict(bad_words=["w"] * 129), "bad_words"),
])
def test_bad_types_of_the_vllm_output_fields_are_400s_naming_the_field(body, param):
    with pytest.raises(ApiError) as e:
        common(**body)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("seed, taken", [(0, 0), (7, 7), (2**63 - 1, 2**63 - 1), (-1, None), (-2, 2**63 - 2), (-2**63, 0)])
def test_a_seed_is_any_64_bit_integer_as_vllm_takes_it(seed, taken):
    assert parse_common(Fields({"seed": seed}), {}, "chat").seed == taken


@pytest.mark.parametrize("seed", [2**63, -2**63 - 1, 1.5, "-9223372036854775809", "1e19"])
def test_a_seed_past_64_bits_is_a_400(seed):
    """Also as the JSON parser reads one: an integer past int64 comes out a float, which may round into
    range (-2^63 - 1 reads as -2^63)."""
    import orjson

    if isinstance(seed, str):
        seed = orjson.loads(seed)
    with pytest.raises(ApiError) as e:
        parse_common(Fields({"seed": seed}), {}, "chat")
    assert e.value.param == "seed"
