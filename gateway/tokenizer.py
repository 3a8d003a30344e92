"""The gateway's view of a checkpoint's text side: tokenizer, special tokens, chat template.

Builds a ``tokenizers.Tokenizer`` from the files ``shared.tokenizer_files``
finds (tokenizer.json, tokenizer_config.json, the chat template chosen by
transformers' precedence) and reads ``generation_config.json`` beside them. No
torch, no transformers.

``TextTokenizer`` also knows each token's raw bytes (for logprobs' ``bytes``):
for a byte-level BPE the vocabulary strings are bytes spelled in GPT-2's
printable alphabet, mapped back here; added tokens are their UTF-8 content.
"""

from __future__ import annotations

import functools

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from ignis.gateway.vision_settings import VisionSettings, read_vision_settings
from ignis.shared.tokenizer_files import (
    TokenizerFilesError,
    bytes_to_unicode,
    read_json_object,
    read_tokenizer_files,
)

SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""Names transformers passes to chat templates (``special_tokens_map``), when set."""


def _decoder_json(tok: Tokenizer) -> object:
    """The tokenizer's decoder as tokenizer.json describes it (None without one), read from the loaded
    tokenizer: parsing the whole file again would build a Python copy of the vocabulary and merges."""
    decoder = tok.decoder
    return None if decoder is None else json.loads(decoder.__getstate__())


def _uses_byte_level(decoder: object) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_uses_byte_level(d) for d in decoder.get("decoders") or ())


@dataclass
class TextTokenizer:
    """Encode, decode and describe tokens of one checkpoint."""

    tokenizer: Tokenizer
    config: dict = field(default_factory=dict)
    byte_level: bool = False

    def __post_init__(self):
        added = self.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.added_content = {i: t.content for i, t in added.items()}
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        # each token's bytes once looked up, by id: a list sized once (8 bytes a slot), so serving for
        # hours adds only the bytes objects of tokens seen, never the growth of a hash table
        self._bytes_cache: list[bytes | None] = [None] * self.vocab_size
        self._byte_decoder = {c: b for b, c in bytes_to_unicode().items()} if self.byte_level else {}

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token stands for: its vocabulary string's length (byte-level BPE spells
        each byte as one character, so this bounds what the token decodes to), added tokens included."""
        return max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids) -> list[str]:
        """Each id's string in the vocabulary (byte-level BPE spells bytes as GPT-2's characters, ``Ġ``...)."""
        return [self.tokenizer.id_to_token(i) or "" for i in ids]

    def token_id(self, text: str) -> int | None:
        return self.tokenizer.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token ``token_id`` stands for (may be part of a UTF-8 character)."""
        cache = self._bytes_cache
        cached = cache[token_id] if 0 <= token_id < len(cache) else None
        if cached is not None:
            return cached
        if token_id in self.added_content:
            raw = self.added_content[token_id].encode()
        else:
            piece = self.tokenizer.id_to_token(token_id)
            if piece is None:
                raw = b""
            elif self.byte_level and all(c in self._byte_decoder for c in piece):
                raw = bytes(self._byte_decoder[c] for c in piece)
            else:
                raw = self.tokenizer.decode([token_id], skip_special_tokens=False).encode()
        if 0 <= token_id < len(cache):
            cache[token_id] = raw
        return raw

    def token_text(self, token_id: int) -> str:
        """The token as text for logprobs (an incomplete UTF-8 sequence shows as U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def special_tokens_map(self) -> dict[str, str]:
        """The special tokens by name as transformers hands them to chat templates."""
        out = {}
        for name in SPECIAL_TOKEN_ATTRIBUTES:
            value = self.config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                out[name] = value
        return out


@dataclass
class ModelFiles:
    """What the gateway reads from a checkpoint directory."""

    tokenizer: TextTokenizer
    chat_template: str | None
    generation_config: dict
    vision: VisionSettings | None = None  # None: the checkpoint takes no images


def load_model_files(model_dir: str | Path) -> ModelFiles:
    """The tokenizer, chat template and generation config of ``model_dir``; a bad file raises TokenizerFilesError."""
    files = read_tokenizer_files(model_dir)
    try:
        tok = Tokenizer.from_file(str(files.tokenizer_json))
    except Exception as e:  # the library raises its own exception type
        raise TokenizerFilesError(f"{files.tokenizer_json}: cannot load the tokenizer: {e}") from None
    gen_path = Path(model_dir) / "generation_config.json"
    gen = read_json_object(gen_path) if gen_path.is_file() else {}
    text = TextTokenizer(tok, files.tokenizer_config, byte_level=_uses_byte_level(_decoder_json(tok)))
    vision = read_vision_settings(model_dir, text.token_id("<|image_pad|>"))
    return ModelFiles(tokenizer=text, chat_template=files.chat_template, generation_config=gen, vision=vision)
