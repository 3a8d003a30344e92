"""Incremental detokenizing: token ids in, text deltas out, correct UTF-8 across token boundaries.

A byte-level BPE token may hold part of a UTF-8 character, so decoding one
token at a time is wrong. Instead the growing id list is decoded over a short
window and only the stable part is emitted:

    ids:  ... | prefix_offset ........ read_offset | new ids ...
                 \\__ already emitted __/
    text = decode(ids[prefix_offset:]);  emitted part = decode(ids[prefix_offset:read_offset])
    delta = text[len(emitted part):]     held back while it ends in U+FFFD (an incomplete character)

Special tokens (``<|im_end|>``, ``<|endoftext|>``) decode to nothing, unless
``skip_special_tokens=False`` (vLLM's request field) asks for their text: then
a special token that is the last one so far is held until the next arrives,
since it may be the token the output stopped on, whose text vLLM leaves out
(``finish(stopped=True)`` drops it); with ``ignore_eos`` or
``include_stop_str_in_output`` none is (``hold_specials=False``). ``finish()``
flushes whatever is held back, so the concatenated deltas equal
``decode(all ids)`` (less that stop token). Plain Python over ``gateway.tokenizer.TextTokenizer``.

Fast path, for a tokenizer whose decoder is byte-level BPE alone (Qwen's) and
whose added tokens are ASCII: decoding is then the concatenation of each
token's bytes (``token_bytes``, cached per id), read as UTF-8. Each token's
bytes go through an incremental UTF-8 decoder, which holds an incomplete
character until its last byte arrives: O(1) per token, no re-decode of a
window. Invalid bytes become U+FFFD as the tokenizer's lossy decode makes
them.
"""

from __future__ import annotations

from codecs import utf_8_decode as _utf8_decode

from ignis.gateway.tokenizer import TextTokenizer, _decoder_json

_REPLACEMENT = "\ufffd"
_WINDOW = 6
"""Tokens of context kept before the unread ones: enough for any UTF-8 character to start inside."""


_BYTES_DECODABLE: dict[int, tuple[object, bool]] = {}
"""id(tokenizers.Tokenizer) -> (that tokenizer, whether the fast path applies); kept alive so ids stay unique."""


def bytes_decodable(tokenizer: TextTokenizer) -> bool:
    """Decoding ``tokenizer`` is reading the concatenated ``token_bytes`` of its ids as UTF-8."""
    key = id(tokenizer.tokenizer)
    known = _BYTES_DECODABLE.get(key)
    if known is None:
        ok = (tokenizer.byte_level and (_decoder_json(tokenizer.tokenizer) or {}).get("type") == "ByteLevel"
              and all(c.isascii() for c in tokenizer.added_content.values()))
        known = _BYTES_DECODABLE[key] = (tokenizer.tokenizer, ok)
    return known[1]


class IncrementalDetokenizer:
    """Detokenizes one stream."""

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True, byte_path: bool = True,
                 hold_specials: bool = True):
        """``byte_path=False`` keeps the window even where the byte path applies (to compare the two).
        ``hold_specials=False``: no shown special token can be the one the output stops on with its text
        left out (``ignore_eos``, or ``include_stop_str_in_output``): none is held."""
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._byte_path = byte_path and bytes_decodable(tokenizer)
        self._held = b""  # the byte path's incomplete UTF-8 character at the end, waiting for its last bytes
        self._skipped = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._special = frozenset() if skip_special_tokens or not hold_specials else tokenizer.special_ids
        self._held_special: int | None = None  # a shown special token at the end, held: it may be the stop
        self.late = 0  # characters at the start of the last push's text that are an earlier token's (held)

    def push(self, token_ids) -> str:
        """Add tokens; return the newly stable text (may be empty). ``late`` says how much of it is the text
        of a special token held from an earlier push."""
        self.late = 0
        if self._special:
            held = self._held_special
            token_ids = self._hold(token_ids)
            if not token_ids:
                return ""
            if held is None:
                return self._push(token_ids)
            # the held token first, alone: its text (with an incomplete character of an earlier token's that
            # it ends, as U+FFFD) is exactly what is late
            text = self._push(token_ids[:1])
            self.late = len(text)
            return text + self._push(token_ids[1:]) if len(token_ids) > 1 else text
        return self._push(token_ids)

    def _hold(self, token_ids) -> list[int]:
        ids = list(token_ids)
        if self._held_special is not None:
            ids.insert(0, self._held_special)
            self._held_special = None
        if ids and ids[-1] in self._special:
            self._held_special = ids.pop()
        return ids

    def _push(self, token_ids) -> str:
        self.ids.extend(token_ids)
        if self._byte_path:
            piece, skipped = self._tok.token_bytes, self._skipped
            if len(token_ids) == 1:
                t = token_ids[0]
                if t in skipped:
                    return ""
                data = piece(t)
            else:
                data = b"".join(piece(t) for t in token_ids if t not in skipped)
            if self._held:
                data = self._held + data
            text, used = _utf8_decode(data, "replace", False)  # what codecs' incremental decoder does
            self._held = data[used:] if used < len(data) else b""
            return text
        return self._step(final=False)

    def finish(self, stopped: bool = False) -> str:
        """All tokens are in: return the text still held back. ``stopped``: the output ended on a stop token
        (end of sequence, a ``stop_token_ids`` id), so a shown special token held at the end is that one,
        left out."""
        held, self._held_special = self._held_special, None
        text = self._push((held,)) if held is not None and not stopped else ""
        return text + self._flush()

    def _flush(self) -> str:
        if self._byte_path:
            held, self._held = self._held, b""
            return _utf8_decode(held, "replace", True)[0]
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
