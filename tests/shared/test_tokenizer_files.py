"""The tokenizer-files reader: template precedence, named templates, the engine's vocabulary size, each error."""

from __future__ import annotations

import json

import pytest

from ignis.shared.tokenizer_files import TokenizerFilesError, read_tokenizer_files, tokenizer_vocab_size


def test_inline_template(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}", "eos_token": "<e>"}))
    tok = read_tokenizer_files(tmp_path)
    assert tok.tokenizer_json == tmp_path / "tokenizer.json"
    assert tok.tokenizer_config["eos_token"] == "<e>"
    assert tok.chat_template == "{{ x }}" and tok.chat_template_source.endswith("tokenizer_config.json")


def test_named_templates_and_jinja_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    tok = read_tokenizer_files(tmp_path)
    assert tok.chat_template == "D" and tok.named_templates["tool_use"] == "T"
    (tmp_path / "chat_template.jinja").write_text("J")
    tok = read_tokenizer_files(tmp_path)
    assert tok.chat_template == "J" and tok.chat_template_source.endswith("chat_template.jinja")


def test_chat_template_json_wins_over_the_config_unless_it_has_no_default(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "C"}))
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    tok = read_tokenizer_files(tmp_path)
    assert tok.chat_template == "C" and tok.chat_template_source.endswith("tokenizer_config.json")
    assert tok.named_templates == {"default": "C", "tool_use": "T"}
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "S"}))
    tok = read_tokenizer_files(tmp_path)
    assert tok.chat_template == "S" and tok.chat_template_source.endswith("chat_template.json")


def test_without_template(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    tok = read_tokenizer_files(tmp_path)
    assert tok.chat_template is None and tok.chat_template_source is None
    assert tok.tokenizer_config == {} and tok.tokenizer_config_path is None


def test_errors(tmp_path):
    with pytest.raises(TokenizerFilesError, match="not a directory"):
        read_tokenizer_files(tmp_path / "absent")
    with pytest.raises(TokenizerFilesError, match="no tokenizer.json"):
        read_tokenizer_files(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(TokenizerFilesError, match="tokenizer_config.json: cannot read JSON"):
        read_tokenizer_files(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[]")
    with pytest.raises(TokenizerFilesError, match="tokenizer_config.json: expected a JSON object"):
        read_tokenizer_files(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3}))
    with pytest.raises(TokenizerFilesError, match="chat_template must be"):
        read_tokenizer_files(tmp_path)


def test_vocab_size_counts_added_tokens_and_is_none_when_unreadable(tmp_path):
    assert tokenizer_vocab_size(tmp_path) is None
    (tmp_path / "tokenizer.json").write_text("{oops")
    assert tokenizer_vocab_size(tmp_path) is None
    data = {"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 5, "content": "<s>"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_vocab_size(tmp_path) == 6
