"""Incremental detokenizing: token ids in, text deltas out, correct UTF-8 across token boundaries.

A byte-level BPE token may hold part of a UTF-8 character, so decoding one
token at a time is wrong. Instead the growing id list is decoded over a short
window and only the stable part is emitted:

    ids:  ... | prefix_offset ........ read_offset | new ids ...
                 \\__ already emitted __/
    text = decode(ids[prefix_offset:]);  emitted part = decode(ids[prefix_offset:read_offset])
    delta = text[len(emitted part):]     held back while it ends in U+FFFD (an incomplete character)

Special tokens (``<|im_end|>``, ``<|endoftext|>``) decode to nothing.
``finish()`` flushes whatever is held back, so the concatenated deltas equal
``decode(all ids)``. Plain Python over ``gateway.tokenizer.TextTokenizer``.
"""

from __future__ import annotations

from ignis.gateway.tokenizer import TextTokenizer

_REPLACEMENT = "\ufffd"
_WINDOW = 6
"""Tokens of context kept before the unread ones: enough for any UTF-8 character to start inside."""


class IncrementalDetokenizer:
    """Detokenizes one stream."""

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids) -> str:
        """Add tokens; return the newly stable text (may be empty)."""
        self.ids.extend(token_ids)
        return self._step(final=False)

    def finish(self) -> str:
        """All tokens are in: return the text still held back."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        if self._read_offset >= len(self.ids):
            return ""
        decode = self._tok.decode
        prefix = decode(self.ids[self._prefix_offset:self._read_offset], self._skip)
        text = decode(self.ids[self._prefix_offset:], self._skip)
        if not final and (len(text) <= len(prefix) or text.endswith(_REPLACEMENT)):
            return ""  # nothing new yet, or an incomplete character at the end
        delta = text[len(prefix):]
        self._read_offset = len(self.ids)
        self._prefix_offset = max(self._prefix_offset, self._read_offset - _WINDOW)
        return delta
