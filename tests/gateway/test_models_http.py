"""Several configured models through HTTP: switching, and unloading after idleness.

Two checkpoints (the demo model and a copy with different weights and a
shorter context) behind one `ignis serve`. The right model answers each request; a switch and an idle
unload free all retained state, so the next identical request reports
cached_tokens 0 and still produces the same tokens.
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve

OTHER_LEN = 1024  # the other model's context; the demo's is the pool's, 8192
PROMPT = [{"role": "system", "content": "You keep answers short. " * 30},
          {"role": "user", "content": "Name three colours of the sea."}]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, demo_dir):
    other = tmp_path_factory.mktemp("models") / "other"
    shutil.copytree(demo_dir, other)
    tensors = load_file(str(other / "model.safetensors"))
    rng = np.random.default_rng(5)
    tensors = {k: (v + rng.normal(0, 0.05, v.shape).astype(v.dtype)) if v.ndim == 2 else v
               for k, v in tensors.items()}
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "max_position_embeddings": OTHER_LEN}))
    return demo_dir, other


@pytest.fixture(scope="module")
def multi_server(tmp_path_factory, two_models):
    from openai import OpenAI

    demo, other = two_models
    s = start_serve(tmp_path_factory.mktemp("multi"), [
        "--model", f"demo={demo}", "--model", f"other={other}", "--idle-unload-s", "2",
        "--kv-pool-tokens", "8192", "--decode-lanes", "4", "--api-key", API_KEY])
    client = OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


def ask(client, model):
    r = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.model == model
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


def idle_unloads(server) -> int:
    """How often the demo model was unloaded for idleness so far (the whole output, not ``log()``'s tail)."""
    return (server.out.read_text() + server.err.read_text()).count("unloaded model demo (idle")


def test_models_are_listed(multi_server):
    server, _ = multi_server
    reply = http("GET", server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status == 200
    assert [m["id"] for m in reply.json()["data"]] == ["demo", "other"]


def test_switch_serves_the_named_model_and_frees_retained_state(multi_server):
    server, client = multi_server
    demo_text, cached = ask(client, "demo")
    assert cached == 0
    again, cached = ask(client, "demo")
    assert again == demo_text and cached > 0  # retained while demo stays loaded
    other_text, _ = ask(client, "other")
    assert other_text != demo_text  # a different model answered
    after_switch, cached = ask(client, "demo")
    assert after_switch == demo_text
    assert cached == 0  # the switches freed every retained entry
    assert "unloaded model demo (switching to other)" in server.log()
    r = client.chat.completions.create(messages=PROMPT, max_tokens=8, temperature=0, model="demo")
    assert r.model == "demo"


def test_idle_unload_then_the_next_request_loads_again(multi_server):
    server, client = multi_server
    unloads = idle_unloads(server)  # one may have happened before the first request
    first, _ = ask(client, "demo")
    _, cached = ask(client, "demo")
    assert cached > 0
    deadline = time.monotonic() + 30
    while idle_unloads(server) == unloads:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    text, cached = ask(client, "demo")
    assert text == first and cached == 0


def test_unknown_model_is_404(multi_server):
    server, _ = multi_server
    reply = http("POST", server.url + "/v1/chat/completions",
                 body=b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}',
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_each_request_is_checked_against_the_context_of_the_model_it_names(multi_server):
    """Not the loaded model's: after the short-context model ran, a long prompt for the demo model is served
    (it was a 400 naming 1024); with the demo model loaded, the short one's limit still holds."""
    import openai

    server, client = multi_server
    ask(client, "other")
    long_prompt = [{"role": "user", "content": "sea " * 1500}]
    r = client.chat.completions.create(model="demo", messages=long_prompt, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens > OTHER_LEN and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:  # demo is loaded now
        client.chat.completions.create(model="other", messages=PROMPT, max_tokens=OTHER_LEN, temperature=0)
    assert e.value.body["code"] == "context_length_exceeded" and f"is {OTHER_LEN} tokens" in e.value.body["message"]
    models = http("GET", server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"]
    assert {m["id"]: m["max_model_len"] for m in models} == {"demo": 8192, "other": OTHER_LEN}


def switches(server) -> int:
    return (server.out.read_text() + server.err.read_text()).count("(switching to ")


def test_a_burst_interleaving_two_models_costs_one_switch_each_way(multi_server):
    """While a long demo request runs, requests for other, demo, other, demo, other arrive: the switch to
    other serves all three, the one back serves both demo requests (it was a switch per request, five), and
    every answer is its model's."""
    from concurrent.futures import ThreadPoolExecutor

    server, client = multi_server
    expected = {"demo": ask(client, "demo")[0], "other": ask(client, "other")[0]}
    ask(client, "demo")
    before = switches(server)
    stream = client.chat.completions.create(model="demo", messages=PROMPT, max_tokens=300, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)  # the long request runs
    names = ["other", "demo", "other", "demo", "other"]
    with ThreadPoolExecutor(len(names)) as pool:
        futures = [pool.submit(ask, client, name) for name in names]
        rest = sum(1 for _ in chunks)
        answers = [f.result()[0] for f in futures]
    assert rest > 0
    assert answers == [expected[name] for name in names]
    assert switches(server) - before <= 2, server.log()
