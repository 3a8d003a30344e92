"""vLLM's bad_words tokenized as vLLM does: the word, and " " + word when that is another token sequence."""

from __future__ import annotations

import pytest

from ignis.gateway.bad_words import bad_word_ids
from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields
from ignis.gateway.params import parse_common, sampling_for


def ids_of(words, tokenizer):
    return bad_word_ids(Fields({}), tuple(words), tokenizer)


def test_a_word_is_sent_as_given_and_with_a_leading_space(demo_tokenizer):
    tok = demo_tokenizer
    plain, spaced = tuple(tok.encode("hello")), tuple(tok.encode(" hello"))
    assert len(plain) == len(spaced) == 1 and plain != spaced
    assert ids_of(["hello"], tok) == (plain, spaced)
    assert ids_of(["  hello"], tok) == (plain, spaced)  # leading whitespace is not part of the word
    two = tuple(tok.encode("hello world"))
    assert len(two) == 2 and ids_of(["hello world"], tok) == (two, tuple(tok.encode(" hello world")))


def test_a_spaced_form_of_another_length_or_first_token_is_left_out(demo_tokenizer):
    tok = demo_tokenizer
    # a leading space the tokenizer keeps as its own token: the spaced form's length differs
    word = next(w for w in ("!!", "??", "...", "1234") if len(tok.encode(" " + w)) != len(tok.encode(w)))
    assert ids_of([word], tok) == (tuple(tok.encode(word)),)


def test_repeats_are_sent_once_and_the_limits_hold(demo_tokenizer):
    tok = demo_tokenizer
    assert ids_of(["hello", " hello", "hello"], tok) == ids_of(["hello"], tok)
    with pytest.raises(ApiError, match="at most 64") as e:
        ids_of(["7" * 65], tok)  # one token a digit
    assert e.value.param == "bad_words"
    words = [f"w{i}x" for i in range(128)]
    with pytest.raises(ApiError, match="at most 128") as e:
        ids_of(words, tok)
    assert e.value.param == "bad_words"


def test_the_served_model_tokenizes_and_each_choice_carries_the_ids(demo_tokenizer):
    p = parse_common(Fields({"bad_words": ["hello"], "n": 2}), {}, "completion").for_model(Fields({}), demo_tokenizer)
    assert p.bad_word_ids == ids_of(["hello"], demo_tokenizer)
    assert sampling_for(p, 8, 0).bad_words == sampling_for(p, 8, 1).bad_words == p.bad_word_ids
    assert parse_common(Fields({}), {}, "chat").for_model(Fields({}), demo_tokenizer).bad_word_ids == ()
