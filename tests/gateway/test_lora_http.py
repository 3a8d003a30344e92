"""LoRA adapters served with the demo model (``--lora-modules NAME=PATH``) through HTTP.

``ignis serve`` with a random PEFT adapter of the demo model: the adapter is a
model of /v1/models (its parent and directory named, as vLLM lists one); a
completion naming it gives transformers' greedy tokens over the merged weights
(``W + scale * B @ A``), the base model's name the base model's, both in one
batch; prompt reuse never crosses between the adapter and the base model (nor
between adapters), and a resumed adapter request answers as its cold run.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE
from tests.engine.lora_adapters import merged_reference, write_adapter
from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve

RANK, ALPHA = 8, 16.0


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, hf_model):
    from openai import OpenAI

    tmp = tmp_path_factory.mktemp("lora-serve")
    pairs = write_adapter(tmp / "tuned", hf_model, rank=RANK, alpha=ALPHA, seed=3, spread=2.0)
    write_adapter(tmp / "other", hf_model, rank=4, alpha=4.0, seed=4, spread=2.0)
    server = start_serve(tmp, ["--kv-pool-tokens", "16384", "--decode-lanes", "4", "--api-key", API_KEY,
                               "--lora-modules", f"tuned={tmp / 'tuned'}", "--lora-modules", f"other={tmp / 'other'}"])
    client = OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    yield server, client, merged_reference(hf_model, pairs, ALPHA / RANK), tmp
    client.close()
    assert stop_serve(server) == 0, server.log()


def greedy(model, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out])).logits[0, -1, :TOKENIZER_SIZE]
            out.append(int(torch.argmax(logits)))
    return out[len(ids):]


def _complete(client, model: str, ids: list[int], n: int = 8) -> list[int]:
    r = client.completions.create(model=model, prompt=ids, max_tokens=n, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    return r.choices[0].token_ids


def test_the_adapters_are_models_with_their_parent(lora_server):
    server, client, _, tmp = lora_server
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {server.model, "tuned", "other"}
    tuned = client.models.retrieve("tuned").model_dump()
    assert tuned["parent"] == server.model and tuned["root"] == str(tmp / "tuned")
    assert "parent" not in client.models.retrieve(server.model).model_dump()


def test_an_adapters_completion_is_transformers_greedy_over_merged_weights(lora_server, hf_model):
    server, client, merged, _ = lora_server
    ids = [int(t) for t in torch.randint(0, TOKENIZER_SIZE, (40,), generator=torch.Generator().manual_seed(7))]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # in one batch: the adapter's rows and the base's
        futures = {name: pool.submit(_complete, client, name, ids) for name in ("tuned", server.model, "other")}
        got = {name: f.result() for name, f in futures.items()}
    assert got["tuned"] == greedy(merged, ids, 8)
    assert got[server.model] == greedy(hf_model, ids, 8)
    assert got["tuned"] != got[server.model]  # the adapter does change the answer
    r = client.completions.create(model="tuned", prompt=ids, max_tokens=2)
    assert r.model == "tuned"


def test_reuse_never_crosses_between_the_adapter_and_the_base_model(lora_server):
    server, client, _, _ = lora_server
    messages = [{"role": "system", "content": "You answer tersely. " + "lorem ipsum dolor " * 60},
                {"role": "user", "content": "Name three colours."}]

    def chat(model):
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens

    base_cold, cached = chat(server.model)
    assert cached == 0
    assert chat(server.model)[1] > 0  # the base model resumes its own state
    tuned_cold, cached = chat("tuned")
    assert cached == 0  # not the base model's state
    tuned_warm, cached = chat("tuned")
    assert cached > 0 and tuned_warm == tuned_cold
    assert chat("other")[1] == 0  # nor another adapter's
    assert '"adapter":"tuned"' in server.log()


def test_an_unknown_adapter_is_a_404(lora_server):
    server, _, _, _ = lora_server
    r = http("POST", server.url + "/v1/completions", b'{"model": "nope", "prompt": "hi", "max_tokens": 1}',
             {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"


def _post(server, path: str, body: dict):
    import json

    return http("POST", server.url + path, json.dumps(body).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})


def test_runtime_loading_is_off_without_its_flag(lora_server):
    server, _, _, tmp = lora_server
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp / "tuned")}).status == 404


@pytest.fixture(scope="module")
def updating_server(tmp_path_factory, hf_model):
    from openai import OpenAI

    tmp = tmp_path_factory.mktemp("lora-updating")
    pairs = write_adapter(tmp / "late", hf_model, rank=RANK, alpha=ALPHA, seed=5, spread=2.0)
    server = start_serve(tmp, ["--kv-pool-tokens", "16384", "--decode-lanes", "4", "--api-key", API_KEY,
                               "--enable-lora-updating", "--idle-unload-s", "3"])
    client = OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    yield server, client, merged_reference(hf_model, pairs, ALPHA / RANK), tmp
    client.close()
    assert stop_serve(server) == 0, server.log()


def test_an_adapter_loaded_while_serving_answers_until_it_is_unloaded(updating_server, hf_model):
    import time

    server, client, merged, tmp = updating_server
    ids = [int(t) for t in torch.randint(0, TOKENIZER_SIZE, (30,), generator=torch.Generator().manual_seed(9))]
    assert "late" not in {m.id for m in client.models.list().data}
    _complete(client, server.model, ids, 2)  # the default model is loaded
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(tmp / "late")})
    assert r.status == 200 and r.body.decode() == "Success: LoRA adapter 'late' added successfully.", r.body
    assert "late" in {m.id for m in client.models.list().data}
    assert _complete(client, "late", ids) == greedy(merged, ids, 8)
    # refused: the name taken, a directory without an adapter, a missing field; serving goes on
    _complete(client, server.model, ids, 1)  # the model stays loaded (idle unload after 3 s)
    again = _post(server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(tmp / "late")})
    assert again.status == 400 and "already loaded" in again.json()["error"]["message"]
    bad = _post(server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(tmp)})
    assert bad.status == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "x"}).json()["error"]["param"] == "lora_path"
    # an idle unload and the reload that follows keep the adapter loaded at run time
    deadline = time.monotonic() + 60
    while "unloaded model" not in server.log():
        assert time.monotonic() < deadline, server.log()[-2000:]
        time.sleep(0.2)
    assert _complete(client, "late", ids) == greedy(merged, ids, 8)
    r = _post(server, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert r.status == 200 and r.body.decode() == "Success: LoRA adapter 'late' removed successfully."
    assert "late" not in {m.id for m in client.models.list().data}
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "late"}).status == 404
    gone = http("POST", server.url + "/v1/completions", b'{"model": "late", "prompt": "hi", "max_tokens": 1}',
                {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    assert gone.status == 404
    assert _complete(client, server.model, ids) == greedy(hf_model, ids, 8)
