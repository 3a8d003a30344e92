"""The tokenizer side of a checkpoint directory, read once for every process: pure file reading.

Owns the file names and the reading rules of ``tokenizer.json``,
``tokenizer_config.json`` and the chat template. The template is chosen by the
same precedence as transformers: ``chat_template.jinja``, else
``chat_template.json``, else the ``chat_template`` entry of
tokenizer_config.json; of a list of named templates (``[{"name", "template"}]``)
the one named "default". The gateway builds its tokenizer and template from
``read_tokenizer_files``; the engine asks ``tokenizer_vocab_size`` only.

No torch, no ``tokenizers`` library: JSON and text only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import orjson

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
CHAT_TEMPLATE_JSON = "chat_template.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"


class TokenizerFilesError(ValueError):
    """A tokenizer or template file is missing or unreadable; the message names the file."""


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; anything else (unreadable, not JSON, not an object) raises."""
    try:
        raw = path.read_bytes()
        try:
            data = orjson.loads(raw)  # a 248K-entry tokenizer.json: 4x faster than json
        except orjson.JSONDecodeError:  # what only json takes (NaN, integers past 64 bits), or its message
            data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerFilesError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerFilesError(f"{path}: expected a JSON object")
    return data


@dataclass(frozen=True)
class TokenizerFiles:
    """Where a checkpoint's tokenizer is, its config, and the chat template chosen for it."""

    tokenizer_json: Path
    tokenizer_config_path: Path | None
    tokenizer_config: dict
    chat_template: str | None
    chat_template_source: str | None  # the file ``chat_template`` came from; None when there is none
    named_templates: dict[str, str]  # every template of the list forms by name, chosen or not


def _named(value: object, source: Path) -> dict:
    """A ``chat_template`` value as {name: template}; a bare string is named "default"."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):  # entries that are not objects are passed over, as transformers does
        return {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    raise TokenizerFilesError(f"{source}: chat_template must be a string or a list of named templates")


def read_tokenizer_files(model_dir: str | Path) -> TokenizerFiles:
    """Find tokenizer.json, read tokenizer_config.json and choose the chat template (module docstring).

    tokenizer.json must exist; it is located, not parsed (its readers parse it).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise TokenizerFilesError(f"{model_dir}: not a directory")
    tok_path = model_dir / TOKENIZER_JSON
    if not tok_path.is_file():
        raise TokenizerFilesError(f"{tok_path}: no tokenizer.json in the model directory")
    cfg_path = model_dir / TOKENIZER_CONFIG_JSON
    has_cfg = cfg_path.is_file()
    tok_cfg = read_json_object(cfg_path) if has_cfg else {}
    named = _named(tok_cfg.get("chat_template"), cfg_path)
    template, source = named.get("default"), cfg_path
    tpl_json = model_dir / CHAT_TEMPLATE_JSON
    if tpl_json.is_file():
        from_json = _named(read_json_object(tpl_json).get("chat_template"), tpl_json)
        named.update(from_json)
        if from_json.get("default"):  # an empty or missing default keeps tokenizer_config's
            template, source = from_json["default"], tpl_json
    jinja = model_dir / CHAT_TEMPLATE_JINJA
    if jinja.is_file():
        template, source = jinja.read_text(encoding="utf-8"), jinja
    return TokenizerFiles(
        tokenizer_json=tok_path,
        tokenizer_config_path=cfg_path if has_cfg else None,
        tokenizer_config=tok_cfg,
        chat_template=template,
        chat_template_source=str(source) if template is not None else None,
        named_templates=named,
    )


def added_token_id(model_dir: str | Path, content: str) -> int | None:
    """The id tokenizer.json's added tokens give ``content`` (``<|image_pad|>``); None if none or unreadable."""
    try:
        data = read_json_object(Path(model_dir) / TOKENIZER_JSON)
    except TokenizerFilesError:
        return None
    added = data.get("added_tokens")
    return next((t["id"] for t in added if isinstance(t, dict) and t.get("content") == content
                 and type(t.get("id")) is int), None) if isinstance(added, list) else None


def tokenizer_vocab_size(model_dir: str | Path) -> int | None:
    """One past the highest token id tokenizer.json names (vocabulary and added tokens); None if unreadable."""
    try:
        data = read_json_object(Path(model_dir) / TOKENIZER_JSON)
    except TokenizerFilesError:
        return None
    vocab = data.get("model", {}).get("vocab", {})
    ids = [int(v) for v in vocab.values()] if isinstance(vocab, dict) else []
    ids += [int(t["id"]) for t in data.get("added_tokens", []) if "id" in t]
    return max(ids) + 1 if ids else None


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are spelled in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
