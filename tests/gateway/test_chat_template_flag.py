"""``--chat-template`` (vLLM's flag): the operator's template instead of the checkpoint's.

A gateway on Qwen3.5's real tokenizer (and official template) started with
another template, from a file or as text, renders every chat with it: the
prompt the engine is sent, /tokenize, /tokenizer_info and the capture marks
all follow it. A flag that names no file and holds no template text, or a
template that does not compile, stops the gateway at start with a message
naming the flag.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.chat_template import template_option
from tests.gateway.conftest import http
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.hardening_support import gateway_refusal
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.gateway.tools_http_support import model_dir

PLAIN = ("{% for m in messages %}<|im_start|>{{ m.role }}\n[plain] {{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module", params=["file", "text"])
def gateway(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"template-{request.param}")
    path = model_dir(tmp, "qwen3_5")
    flag = PLAIN
    if request.param == "file":
        (tmp / "plain.jinja").write_text(PLAIN)
        flag = str(tmp / "plain.jinja")
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--model", str(path), "--chat-template", flag,
                              "--enable-tokenizer-info-endpoint")
    try:
        yield engine, url
    finally:
        stop(proc)
        engine.close()


def _post(url: str, body: dict):
    return http("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"})


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."}]
RENDERED = ("<|im_start|>system\n[plain] Be brief.<|im_end|>\n<|im_start|>user\n[plain] Hi there.<|im_end|>\n"
            "<|im_start|>assistant\n")


def test_chats_are_rendered_with_the_flags_template(gateway):
    engine, url = gateway
    r = _post(url + "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})
    assert r.status == 200, r.body
    sent = engine.generates[-1]
    text = _post(url + "/detokenize", {"tokens": list(sent.prompt_ids)}).json()["prompt"]
    assert text == RENDERED
    tokens = _post(url + "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert tokens == list(sent.prompt_ids)
    assert http("GET", url + "/tokenizer_info").json()["chat_template"] == PLAIN
    # the marks follow the template: the opener is the last "<|im_start|>assistant\n"
    opener = _post(url + "/tokenize", {"prompt": "<|im_start|>assistant\n", "add_special_tokens": False}).json()
    assert sent.opener_start == len(sent.prompt_ids) - opener["count"] and sent.mark_missing is None


@pytest.mark.parametrize("value, message", [
    ("/nonexistent/template.jinja", "no such file"),
    ("{% for m in messages %}", "does not compile"),
])
def test_a_bad_template_flag_stops_the_gateway_with_a_message(tmp_path, value, message):
    path = model_dir(tmp_path, "qwen3_5")
    stderr = gateway_refusal("--model", str(path), "--engine-endpoint", f"ipc://{tmp_path}/none.sock",
                             "--chat-template", value)
    assert message in stderr, stderr


def test_template_option_reads_a_file_or_takes_template_text(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages }}")
    assert template_option(str(f)) == "{{ messages }}"
    assert template_option("{% if x %}{% endif %}") == "{% if x %}{% endif %}"
    with pytest.raises(ValueError, match="--chat-template"):
        template_option(str(tmp_path / "missing.jinja"))
    (tmp_path / "bin.jinja").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="cannot read"):
        template_option(str(tmp_path / "bin.jinja"))
    with pytest.raises(ValueError, match="--chat-template"):
        template_option("x" * 5000)  # too long to be a path, and no template
