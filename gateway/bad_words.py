"""vLLM's ``bad_words`` request field: the words, checked, and the token sequences the engine bans.

``parse_bad_words`` reads the field: an array of at most 128 strings, each
with text after its leading whitespace, at most 1,000 characters.
``bad_word_ids`` tokenizes them with the served model's tokenizer as vLLM
does: each word without its leading whitespace, with no special tokens; then
" " + word, kept only when it is a different first token at the same length
(the word's form in the middle of a text, where the tokenizer joins the
space to it). Sequences repeated across words are sent once. More than 128
sequences, or one of more than 64 tokens, is a 400 naming the field.

The engine bans a sequence's last token where the output ends with the
tokens before it (``engine.bad_words``).
"""

from __future__ import annotations

from ignis.gateway.fields import Fields
from ignis.gateway.tokenizer import TextTokenizer
from ignis.shared.sampling import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS

FIELD = "bad_words"
MAX_BAD_WORD_CHARS = 1000


def parse_bad_words(f: Fields) -> tuple[str, ...]:
    """The words of the request's ``bad_words`` (none: empty)."""
    words = f.list(FIELD, max_items=MAX_BAD_WORDS) or []
    for i, word in enumerate(words):
        if type(word) is not str or not word.strip():
            raise f.error(FIELD, f"item {i} must be a string with text other than whitespace")
        if len(word) > MAX_BAD_WORD_CHARS:
            raise f.error(FIELD, f"item {i} is {len(word)} characters, at most {MAX_BAD_WORD_CHARS} allowed")
    return tuple(words)


def bad_word_ids(f: Fields, words: tuple[str, ...], tokenizer: TextTokenizer) -> tuple[tuple[int, ...], ...]:
    """The token sequences of ``words``, in order, each once."""
    out: dict[tuple[int, ...], None] = {}
    for i, word in enumerate(words):
        plain = tuple(tokenizer.encode(word.lstrip()))
        if not plain:
            raise f.error(FIELD, f"item {i} has no tokens")
        spaced = tuple(tokenizer.encode(" " + word.lstrip()))
        forms = [plain] + ([spaced] if spaced and spaced[0] != plain[0] and len(spaced) == len(plain) else [])
        for ids in forms:
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise f.error(FIELD, f"item {i} is {len(ids)} tokens, at most {MAX_BAD_WORD_TOKENS} allowed")
            out[ids] = None
    if len(out) > MAX_BAD_WORDS:
        raise f.error(FIELD, f"the words are {len(out)} token sequences (a word is one or two), "
                             f"at most {MAX_BAD_WORDS} allowed")
    return tuple(out)
