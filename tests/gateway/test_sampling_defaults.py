"""A model's recommended sampling fills the fields a request leaves out (vLLM's ``--generation-config``).

The parsing and ranges alone, then a gateway on Qwen3.5's real tokenizer whose
``generation_config.json`` recommends temperature 0.6, top_p 0.95, top_k 20
and 5 new tokens (and a ``min_p`` out of range, left out with a warning), in
front of a scripted engine that records what it is sent: chat, completions,
the Messages and Responses APIs each send the model's values for what they
omit and the request's own for what they give; ``vllm`` turns the defaults
off, ``--override-generation-config`` lays its values over the file's, and a
bad flag stops the gateway at start naming it.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.sampling_defaults import (
    GenerationConfigError,
    SamplingDefaults,
    parse_override,
    sampling_defaults,
)
from tests.gateway.conftest import http
from tests.gateway.fake_engine import MAX_MODEL_LEN, FakeEngine
from tests.gateway.hardening_support import gateway_refusal
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.gateway.tools_http_support import model_dir

QWEN = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2]}


def test_the_checkpoints_sampling_keys_become_defaults_in_order():
    d = sampling_defaults("auto", QWEN, {}, "m")
    assert d.values == (("temperature", 0.6), ("top_p", 0.95), ("top_k", 20))
    assert d.describe() == "temperature=0.6 top_p=0.95 top_k=20" and d.max_new_tokens is None
    assert d.fields(frozenset({"top_k", "min_p"})) == {"top_k": 20}


def test_vllm_source_has_none_and_the_override_lays_over_either():
    assert sampling_defaults("vllm", QWEN, {}, "m") == SamplingDefaults()
    over = parse_override('{"temperature": 0.2, "max_new_tokens": 7, "top_k": -1}')
    d = sampling_defaults("auto", QWEN, over, "m")
    assert dict(d.values) == {"temperature": 0.2, "top_p": 0.95, "top_k": 0, "max_new_tokens": 7}
    assert d.source == "m's generation_config.json and --override-generation-config"
    assert dict(sampling_defaults("vllm", QWEN, over, "m").values) == {"temperature": 0.2, "top_k": 0,
                                                                        "max_new_tokens": 7}


def test_a_checkpoint_value_out_of_range_is_left_out_with_a_warning(caplog):
    d = sampling_defaults("auto", {"temperature": 3.5, "top_p": 0, "top_k": 2.5, "min_p": 0.1}, {}, "m")
    assert d.values == (("min_p", 0.1),)
    assert [r.message.split(":", 1)[1].split()[0] for r in caplog.records] == ["temperature", "top_p", "top_k"]


@pytest.mark.parametrize("text, words", [
    ("{", "not JSON"), ("[1]", "JSON object"), ('{"temp": 1}', "unknown key(s) temp"),
    ('{"temperature": "hot"}', "temperature must be a finite number"), ('{"max_new_tokens": 0}', "max_new_tokens"),
])
def test_a_bad_override_is_refused_naming_the_flag(text, words):
    with pytest.raises(GenerationConfigError, match="--override-generation-config") as e:
        parse_override(text)
    assert words in str(e.value)


def test_a_directory_source_is_strict(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_p": 1.0}))
    assert sampling_defaults(str(tmp_path), QWEN, {}, "m").values == (("temperature", 0.3), ("top_p", 1.0))
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 9}))
    with pytest.raises(GenerationConfigError, match="temperature must be in"):
        sampling_defaults(str(tmp_path), QWEN, {}, "m")


# ----- over HTTP, in front of a scripted engine ----------------------------------------------------------------
SEED = 7  # the fake engine answers max_tokens tokens


def _gateway(tmp_path_factory, name: str, *flags: str):
    tmp = tmp_path_factory.mktemp(name)
    path = model_dir(tmp, "qwen3_5")
    (path / "generation_config.json").write_text(json.dumps(dict(QWEN, min_p=3, max_new_tokens=5)))
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--model", str(path), *flags)
    return tmp, engine, proc, url


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp, engine, proc, url = _gateway(tmp_path_factory, "gen-auto")
    try:
        yield engine, url, tmp
    finally:
        stop(proc)
        engine.close()


def _post(url: str, path: str, body: dict, **headers):
    r = http("POST", url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    assert r.status == 200, r.body
    return r


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "seed": SEED}


def _sent(engine: FakeEngine) -> dict:
    s = engine.generates[-1].sampling
    return {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
            "repetition_penalty": s.repetition_penalty, "max_tokens": s.max_tokens}


MODEL = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0}


def test_chat_takes_the_models_values_for_what_it_omits(gateway):
    engine, url, tmp = gateway
    _post(url, "/v1/chat/completions", CHAT)
    assert _sent(engine) == dict(MODEL, max_tokens=5)
    # the request's own values win, field by field (top_k -1: off)
    _post(url, "/v1/chat/completions", dict(CHAT, temperature=1.0, top_k=-1, min_p=0.05, max_tokens=9))
    assert _sent(engine) == dict(MODEL, temperature=1.0, top_k=0, min_p=0.05, max_tokens=9)
    _post(url, "/v1/chat/completions", dict(CHAT, temperature=0))
    assert _sent(engine)["temperature"] == 0.0 and _sent(engine)["top_k"] == 20
    log = (tmp / "gw.out").read_text()
    assert "min_p must be in [0, 1], got 3; left out" in log
    assert "sampling defaults of qwen3_5 from qwen3_5's generation_config.json: temperature=0.6 top_p=0.95 " \
           "top_k=20 max_new_tokens=5" in log


def test_completions_messages_and_responses_take_them_too(gateway):
    engine, url, _ = gateway
    _post(url, "/v1/completions", {"prompt": "Hi", "seed": SEED})
    assert _sent(engine) == dict(MODEL, max_tokens=5)  # min(16, the model's 5)
    _post(url, "/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}],
                                "metadata": {}}, **{"anthropic-version": "2023-06-01"})
    assert _sent(engine) == dict(MODEL, max_tokens=3)
    _post(url, "/v1/messages", {"max_tokens": 3, "temperature": 1, "top_k": 5,
                                "messages": [{"role": "user", "content": "Hi"}]})
    assert _sent(engine) == dict(MODEL, temperature=1.0, top_k=5, max_tokens=3)
    body = _post(url, "/v1/responses", {"input": "Hi", "top_p": 0.5}).json()
    assert _sent(engine) == dict(MODEL, top_p=0.5, max_tokens=5)
    assert (body["temperature"], body["top_p"]) == (0.6, 0.5)  # the response says what was sampled with


def test_vllm_source_and_override(tmp_path_factory):
    tmp, engine, proc, url = _gateway(tmp_path_factory, "gen-vllm", "--generation-config", "vllm",
                                      "--default-max-tokens", "4")
    try:
        _post(url, "/v1/chat/completions", CHAT)
        assert _sent(engine) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                 "repetition_penalty": 1.0, "max_tokens": 4}
    finally:
        stop(proc)
        engine.close()
    tmp, engine, proc, url = _gateway(tmp_path_factory, "gen-over", "--override-generation-config",
                                      '{"temperature": 0.25, "repetition_penalty": 1.05}')
    try:
        _post(url, "/v1/chat/completions", CHAT)
        assert _sent(engine) == dict(MODEL, temperature=0.25, repetition_penalty=1.05, max_tokens=5)
        _post(url, "/v1/completions", {"prompt": "Hi", "seed": SEED, "max_tokens": MAX_MODEL_LEN - 10})
        assert _sent(engine)["max_tokens"] == MAX_MODEL_LEN - 10  # an explicit max_tokens is not capped
    finally:
        stop(proc)
        engine.close()


@pytest.mark.parametrize("flags, words", [
    (["--override-generation-config", '{"temp": 1}'], "--override-generation-config: unknown key(s) temp"),
    (["--generation-config", "/nonexistent"], "--generation-config must be auto, vllm or a directory"),
])
def test_a_bad_flag_stops_the_gateway_naming_it(flags, words):
    stderr = gateway_refusal(*flags)
    assert words in stderr, stderr
