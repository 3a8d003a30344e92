"""GET /tokenizer_info (``--enable-tokenizer-info-endpoint``): what lm-eval's remote tokenizer reads.

A gateway on Qwen3.5's real tokenizer and official chat template, before a
scripted engine, serves the endpoint; the checks walk lm-eval's
``RemoteTokenizer``: the server is taken as supporting it when the body names
an ``eos_token`` and /tokenize answers ``tokens``; the end token's id is the
first id /tokenize gives for its text; /detokenize gives text back; chats are
rendered from the served ``chat_template`` with plain Jinja, and must equal the
prompt the gateway itself renders. Off by default: the demo server answers 404.
"""

from __future__ import annotations

import json

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tests.gateway.conftest import http
from tests.gateway.tools_http_support import chat_template, tools_gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5", "--enable-tokenizer-info-endpoint")


def get(url: str):
    return http("GET", url)


def post(url: str, body: dict):
    return http("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"})


def test_the_body_is_the_tokenizer_config_with_the_served_template(gateway):
    r = get(gateway.url + "/tokenizer_info")
    assert r.status == 200, r.body
    info = r.json()
    config = gateway.tokenizer.config
    assert info["eos_token"] == "<|im_end|>" and info["pad_token"] == "<|endoftext|>"
    assert info["tokenizer_class"] == config.get("tokenizer_class", "PreTrainedTokenizerFast")
    assert info["chat_template"] == chat_template("qwen3_5")
    assert "added_tokens_decoder" not in info  # the table of added tokens stays in the file
    for key, value in config.items():  # every other setting as the file has it, added tokens as their text
        if key in ("added_tokens_decoder", "chat_template") or value is None:
            continue
        want = value["content"] if isinstance(value, dict) and "content" in value else value
        assert info[key] == want, key
    assert get(gateway.url + "/tokenizer_info?model=nope").status == 404


def test_lm_evals_remote_tokenizer_works_from_it(gateway):
    info = get(gateway.url + "/tokenizer_info").json()
    probe = post(gateway.url + "/tokenize", {"prompt": "test", "add_special_tokens": False}).json()
    assert isinstance(info, dict) and "eos_token" in info and isinstance(probe["tokens"], list)
    eos = post(gateway.url + "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()
    assert eos["tokens"][0] == gateway.tokenizer.token_id("<|im_end|>")
    text = "The quick brown fox, 42 times: naïve café."
    ids = post(gateway.url + "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert post(gateway.url + "/detokenize", {"tokens": ids}).json() == {"prompt": text}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]
    rendered = ImmutableSandboxedEnvironment().from_string(info["chat_template"]).render(
        messages=messages, add_generation_prompt=True)
    served = post(gateway.url + "/tokenize", {"messages": messages}).json()["tokens"]
    assert gateway.tokenizer.encode(rendered, add_special_tokens=False) == served


def test_it_is_off_unless_enabled_and_under_the_api_key(server):
    assert http("GET", server.url + "/tokenizer_info").status == 401  # the key is asked first, as on /tokenize
    keyed = http("GET", server.url + "/tokenizer_info", headers={"Authorization": f"Bearer {server.api_key}"})
    assert keyed.status == 404
