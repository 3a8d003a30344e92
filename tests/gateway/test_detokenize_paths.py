"""The detokenizer's two paths, byte-level (token bytes through a UTF-8 decoder) and window, agree with a full decode."""

from __future__ import annotations

import random

import pytest

from ignis.gateway.detokenize import IncrementalDetokenizer, bytes_decodable

TEXTS = ["emoji 🎉🎉 and ∑ math", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 fraktur", "日本語のテキスト", "<think>why</think>answer <tool_call>x"]


def streamed(tok, ids, sizes, byte_path: bool) -> list[str]:
    d = IncrementalDetokenizer(tok, byte_path=byte_path)
    out, at = [], 0
    for n in sizes:
        out.append(d.push(ids[at:at + n]))
        at += n
    return out + [d.finish()]


def chunks(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while n:
        sizes.append(min(n, rng.randrange(1, 4)))
        n -= sizes[-1]
    return sizes


def test_the_demo_tokenizer_takes_the_byte_path(demo_tokenizer):
    assert bytes_decodable(demo_tokenizer)
    assert IncrementalDetokenizer(demo_tokenizer)._byte_path
    assert not IncrementalDetokenizer(demo_tokenizer, byte_path=False)._byte_path


@pytest.mark.parametrize("byte_path", [True, False])
def test_text_with_split_characters_and_markup_streams_whole(demo_tokenizer, byte_path):
    rng = random.Random(3)
    for text in TEXTS:
        ids = demo_tokenizer.encode(text) + [demo_tokenizer.token_id("<|im_end|>")]
        parts = streamed(demo_tokenizer, ids, chunks(rng, len(ids)), byte_path)
        assert "".join(parts) == text
        assert not any("\ufffd" in p for p in parts)


def test_random_ids_both_paths_equal_the_full_decode(demo_tokenizer):
    rng = random.Random(11)
    specials = sorted(demo_tokenizer.special_ids)
    for _ in range(60):
        ids = [rng.choice(specials) if rng.random() < 0.05 else rng.randrange(demo_tokenizer.vocab_size)
               for _ in range(rng.randrange(1, 80))]
        sizes = chunks(rng, len(ids))
        full = demo_tokenizer.decode(ids)
        assert "".join(streamed(demo_tokenizer, ids, sizes, True)) == full
        assert "".join(streamed(demo_tokenizer, ids, sizes, False)) == full


@pytest.mark.parametrize("byte_path", [True, False])
def test_shown_special_tokens_stream_whole_less_the_stop_token(demo_tokenizer, byte_path):
    """``skip_special_tokens=False``: every token's text, in any chunking; a special token last is held, and
    left out when the output stopped on it (the end-of-sequence token, as vLLM leaves it out)."""
    tok = demo_tokenizer
    rng = random.Random(5)
    specials = sorted(tok.special_ids)
    end = tok.token_id("<|im_end|>")
    for _ in range(40):
        ids = [rng.choice(specials) if rng.random() < 0.2 else rng.randrange(tok.vocab_size)
               for _ in range(rng.randrange(1, 40))] + [end]
        for stopped in (True, False):
            d = IncrementalDetokenizer(tok, skip_special_tokens=False, byte_path=byte_path)
            out, at = [], 0
            for n in chunks(rng, len(ids)):
                out.append(d.push(ids[at:at + n]))
                at += n
                assert not out[-1].endswith("<|im_end|>") or at < len(ids)  # the last one waits
            out.append(d.finish(stopped=stopped))
            kept = ids[:-1] if stopped else ids
            assert "".join(out) == tok.decode(kept, skip_special_tokens=False)
