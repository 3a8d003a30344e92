"""Incremental detokenizing and stop strings, on the demo model's tokenizer (Qwen3.5's), Qwen's real tokenizers
and crafted text deltas."""

from __future__ import annotations

import random
import unicodedata

import pytest

from ignis.gateway.detokenize import IncrementalDetokenizer
from ignis.gateway.stop_strings import StopMatcher
from ignis.gateway.tokenizer import load_model_files
from tests.support.real_tokenizer import FAMILIES, token_ids
from tests.support.tokenizer_samples import STREAM_TEXT


def stream(tok, ids, chunk_sizes=None):
    d = IncrementalDetokenizer(tok)
    out, at = [], 0
    sizes = chunk_sizes or [1] * len(ids)
    for n in sizes:
        out.append(d.push(ids[at:at + n]))
        at += n
    out.append(d.finish())
    return out


WHOLE_CHARACTERS = ["héllo wörld", "日本語のテキスト", "plain ascii words"]
SPLIT_CHARACTERS = ["emoji 🎉🎉 and ∑ math", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 fraktur", "rare 龘 and new 🫠"]
"""Texts whose every token is whole UTF-8 characters, and texts the vocabulary's merges cut mid-character."""


def _splits_characters(tok, ids) -> int:
    """How many of ``ids`` stand for bytes that are not whole UTF-8 characters."""
    count = 0
    for i in ids:
        try:
            tok.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            count += 1
    return count


@pytest.mark.parametrize("text", WHOLE_CHARACTERS + SPLIT_CHARACTERS)
def test_multibyte_characters_split_across_tokens(demo_tokenizer, text):
    ids = demo_tokenizer.encode(text)
    assert (_splits_characters(demo_tokenizer, ids) > 0) == (text in SPLIT_CHARACTERS)
    parts = stream(demo_tokenizer, ids)
    assert "".join(parts) == text
    assert not any("\ufffd" in p for p in parts)


def test_random_token_streams_concatenate_to_the_full_decode(demo_tokenizer):
    rng = random.Random(7)
    for _ in range(40):
        ids = [rng.randrange(demo_tokenizer.vocab_size) for _ in range(rng.randrange(1, 60))]
        sizes, left = [], len(ids)
        while left:
            sizes.append(min(left, rng.randrange(1, 5)))
            left -= sizes[-1]
        assert "".join(stream(demo_tokenizer, ids, sizes)) == demo_tokenizer.decode(ids)


def test_special_tokens_are_not_rendered_but_markup_is(demo_tokenizer):
    ids = demo_tokenizer.encode("<think>a</think>b") + [demo_tokenizer.token_id("<|im_end|>"),
                                                         demo_tokenizer.token_id("<|endoftext|>")]
    text = "".join(stream(demo_tokenizer, ids))
    assert text == "<think>a</think>b"


def test_incomplete_character_is_held_until_complete(demo_tokenizer):
    ids = demo_tokenizer.encode("🫠")
    assert len(ids) > 1
    d = IncrementalDetokenizer(demo_tokenizer)
    assert [d.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.push(ids[-1:]) == "🫠"
    assert d.finish() == ""


@pytest.fixture(scope="module")
def real_tokenizer(real_tokenizer_dir):
    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = load_model_files(real_tokenizer_dir(family)).tokenizer
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_real_tokenizer_streamed_one_token_at_a_time(real_tokenizer, family):
    tok = real_tokenizer(family)
    ids = tok.encode(STREAM_TEXT)
    assert _splits_characters(tok, ids) >= 10  # the real merges cut CJK, emoji and marks mid-character
    parts = stream(tok, ids)
    assert "".join(parts) == tok.decode(ids) == unicodedata.normalize("NFC", STREAM_TEXT)
    assert not any("\ufffd" in p for p in parts)


@pytest.mark.parametrize("family", FAMILIES)
def test_real_tokenizer_streamed_in_uneven_chunks_with_markup(real_tokenizer, family):
    tok = real_tokenizer(family)
    ids = tok.encode("<think>\n" + STREAM_TEXT + "\n</think>\n\n" + STREAM_TEXT)
    ids += [token_ids(family)["<|im_end|>"]]
    rng = random.Random(31)
    for _ in range(10):
        sizes, left = [], len(ids)
        while left:
            sizes.append(min(left, rng.randrange(1, 4)))
            left -= sizes[-1]
        parts = stream(tok, ids, sizes)
        assert "".join(parts) == tok.decode(ids)
        assert not any("\ufffd" in p for p in parts)
    assert tok.decode(ids).startswith("<think>\n") and not tok.decode(ids).endswith("<|im_end|>")


def run_stops(stops, deltas):
    m = StopMatcher(stops)
    out = [m.push(d) for d in deltas]
    out.append(m.finish())
    return "".join(out), m


@pytest.mark.parametrize("deltas", [["hello STOP there"], ["hello ST", "OP there"], ["hello S", "T", "O", "P"],
                                    list("hello STOP there")])
def test_stop_string_across_boundaries(deltas):
    text, m = run_stops(["STOP"], deltas)
    assert text == "hello " and m.stopped and m.matched == "STOP"


@pytest.mark.parametrize("deltas", [["hello STOP there"], ["hello ST", "OP there"], list("hello STOP there")])
def test_include_stop_keeps_the_stop_string_and_nothing_after_it(deltas):
    m = StopMatcher(["STOP", "he"], include_stop=True)
    out = [m.push(d) for d in deltas] + [m.finish()]
    assert "".join(out) == "he" and m.matched == "he"
    m = StopMatcher(["STOP", "ere"], include_stop=True)
    out = [m.push(d) for d in deltas] + [m.push("more"), m.finish()]
    assert "".join(out) == "hello STOP" and m.matched == "STOP"


def test_partial_stop_prefix_is_released_when_it_does_not_complete():
    m = StopMatcher(["STOP"])
    assert m.push("a ST") == "a "
    assert m.push("ART") == "START"
    assert m.push("x S") == "x "
    assert m.finish() == "S"


def test_earliest_of_several_stops_wins():
    text, m = run_stops(["cd", "b"], ["ab", "cd"])
    assert text == "a" and m.matched == "b"
    text, m = run_stops(["xyz", "yz"], ["wx", "yz!"])
    assert text == "w" and m.matched == "xyz"


def test_nothing_after_a_match():
    m = StopMatcher(["."])
    assert m.push("one. two") == "one"
    assert m.push("three") == "" and m.finish() == ""


def test_no_stops_is_a_pass_through():
    m = StopMatcher(())
    assert m.push("abc") == "abc" and m.finish() == ""


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError):
        StopMatcher([""])
