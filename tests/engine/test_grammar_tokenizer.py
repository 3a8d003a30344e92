"""engine.grammar_tokenizer: text a grammar forces that spells a special token stays text.

A choice, a JSON ``const`` or a regex whose text is ``<|im_end|>`` is those characters: the grammar
library tokenizes the forced text with our encoder, and the end token's id there (whose bytes no grammar
takes) failed the request mid-way.
"""

from __future__ import annotations

import numpy as np
import pytest

from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.gateway.grammars import choice_grammar, json_schema_grammar, regex_grammar
from tests.support.real_tokenizer import token_ids

llguidance = pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def vocab(real_tokenizer_dir):
    ids = token_ids("qwen3_5")
    eos = (ids["<|im_end|>"], ids["<|endoftext|>"])
    width = max(ids.values()) + 1
    return load_tokenizer(real_tokenizer_dir("qwen3_5"), width, eos), eos, width


def walk(vocab, grammar: str) -> str:
    """The text of the lowest allowed token at each step until only the end is left."""
    tok, eos, width = vocab
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    out = []
    for _ in range(40):
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")[:width]
        assert not matcher.is_error(), matcher.get_error()
        allowed = np.nonzero(bits)[0].tolist()
        text_ids = [t for t in allowed if t not in eos]
        if not text_ids:
            assert matcher.is_accepting()
            return tok.decode_str(out)
        out.append(text_ids[0])
        assert matcher.consume_token(text_ids[0]), matcher.get_error()
    raise AssertionError("the grammar did not end")


@pytest.mark.parametrize("make", [lambda s: choice_grammar([s]), lambda s: json_schema_grammar({"const": s}),
                                  lambda s: regex_grammar(s.replace("|", "\\|"))])
@pytest.mark.parametrize("text", ["<|im_end|>", "<|endoftext|>", "a<|im_start|>b"])
def test_forced_text_spelling_a_special_token_is_written_as_text(vocab, make, text):
    got = walk(vocab, make(text))
    assert got.strip('"') == text
