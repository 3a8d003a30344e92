"""The grammar library's view of a checkpoint's vocabulary: one ``LLTokenizer`` built from token bytes.

llguidance masks tokens by the bytes they stand for, so it needs every id's
bytes (a byte-level BPE spells them in GPT-2's printable alphabet; added tokens
are their UTF-8 content), which ids are special (a grammar names them as
``<|im_end|>``, never as text) and which ids end a sequence (allowed once the
grammar accepts). The list is as wide as the model's embedding table: ids past
the tokenizer's vocabulary are empty, so no grammar ever allows them.

Text is tokenized (rarely: forced prefixes) with the ``tokenizers`` library on
the same tokenizer.json, special tokens' spellings read as plain text. No
transformers.
"""

from __future__ import annotations

from pathlib import Path

from ignis.shared.tokenizer_files import (
    TokenizerFilesError,
    bytes_to_unicode,
    read_json_object,
    read_tokenizer_files,
)


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: token bytes, special ids, end ids, and an encoder
    (the ``tokenizers`` library's, built on the first text the grammar library asks it to encode: about a
    second at 248K ids, which grammars of choices and regular expressions never pay; JSON and tool-call
    grammars do, on the compile thread)."""

    def __init__(self, tokens: list[bytes], special_ids: list[int], eos_ids: list[int], tokenizer_json: Path):
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = None
        self._tokenizer_json = tokenizer_json
        self._tokenizer = None

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes for a bytes encoder: this one takes text
            raise TypeError("text only")
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self._tokenizer_json))
            # text the grammar forces is text: "<|im_end|>" in a choice is its characters, never the end
            # token (whose bytes the grammar does not take)
            self._tokenizer.encode_special_tokens = True
        return self._tokenizer.encode(text, add_special_tokens=False).ids


def _byte_level_table() -> dict[int, int | str]:
    """``str.translate`` table: a byte-level character to the Latin-1 character of its byte; any other
    character below 256 to one that Latin-1 cannot encode (characters above it cannot already)."""
    table: dict[int, int | str] = {o: "\uffff" for o in range(256)}
    table.update({ord(c): b for b, c in bytes_to_unicode().items()})
    return table


_BYTE_LEVEL_TO_LATIN1 = _byte_level_table()


def token_bytes(tokenizer_json: Path, width: int) -> tuple[list[bytes], list[int]]:
    """(bytes of ids 0 .. width-1, the special ids) from a byte-level BPE tokenizer.json."""
    data = read_json_object(tokenizer_json)
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        raise TokenizerFilesError(f"{tokenizer_json}: grammars need a BPE vocabulary")
    tokens = [b""] * width
    to_latin1 = _BYTE_LEVEL_TO_LATIN1
    for piece, i in vocab.items():
        if type(i) is not int or not 0 <= i < width:
            continue
        try:  # each character of the byte-level alphabet becomes the one Latin-1 character of its byte
            tokens[i] = piece.translate(to_latin1).encode("latin-1")
        except (UnicodeEncodeError, AttributeError):
            raise TokenizerFilesError(f"{tokenizer_json}: token {i} is not byte-level BPE; grammars need one") from None
    special = []
    for t in data.get("added_tokens", []):
        i = t.get("id")
        if type(i) is int and 0 <= i < width:
            tokens[i] = str(t.get("content", "")).encode()
            if t.get("special"):
                special.append(i)
    return tokens, special


def load_tokenizer(model_dir: str | Path, width: int, eos_ids: list[int] | tuple[int, ...]):
    """The ``llguidance.LLTokenizer`` of ``model_dir`` over ``width`` ids (the model's vocabulary size)."""
    import llguidance

    if not eos_ids:
        raise ValueError("grammars need the model's end-of-sequence token ids")
    files = read_tokenizer_files(model_dir)
    tokens, special = token_bytes(files.tokenizer_json, width)
    special = sorted(set(special) | {i for i in eos_ids if 0 <= i < width})
    vocab = _Vocabulary(tokens, special, list(eos_ids), files.tokenizer_json)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=width, eos_token=list(eos_ids))
