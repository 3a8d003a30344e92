"""Prompt reuse under LoRA adapters through HTTP, down the tiers: state never crosses adapters.

``ignis serve`` with a device pool, KV-RAM and KV-disk too small to keep what
it retains, so warm requests resume from the lower tiers. One long prompt
each under the base model and two adapters, in several orders: a first ask
under each resumes nothing (the others' state is not its own), a second one
resumes and answers as the first, greedy tokens and logprobs. An adapter
unloaded and another file loaded under its name resumes nothing of the old
one and answers as the new file does. An adapter whose files go bad while
the model is idle-unloaded is dropped at the reload (a ``--lora-modules`` one
too), the base model keeps serving, ``/v1/models`` stops listing it and its
name can be loaded again.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time

import pytest
import torch

from ignis.shared.demo import ensure_demo_model
from tests.engine.lora_adapters import write_adapter
from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve
from tests.gateway.hardening_support import wait_until
from tests.gateway.test_reuse_http import text

ORDERS = [("base", "A", "B"), ("B", "A", "base"), ("A", "base", "B")]
SMALL = ["--kv-pool-tokens", "1024", "--decode-lanes", "2", "--reuse-host-slots-per-lane", "1",
         "--reuse-kv-host-pool-bytes", "1M", "--kv-disk-bytes", "64M", "--restore-floor-kv-ram", "64",
         "--restore-floor-kv-disk", "64", "--api-key", API_KEY]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Three adapters of the demo model, each changing its answers: A, B and C."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-reuse-adapters")
    model = AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.float32).eval()
    for name, seed in (("A", 3), ("B", 4), ("C", 11)):
        write_adapter(root / name, model, rank=8, alpha=16.0, seed=seed, spread=2.0)
    return root


@contextlib.contextmanager
def serving(tmp, argv):
    """``ignis serve`` for one module: its log printed if a test fails, stopped with exit code 0 after."""
    from openai import OpenAI

    server = start_serve(tmp, argv)
    client = OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    try:
        yield server, client
    except BaseException:
        print(server.log()[-20000:])
        raise
    finally:
        client.close()
        code = stop_serve(server)
    assert code == 0, server.log()


@pytest.fixture(scope="module")
def tiers(tmp_path_factory, adapters):
    tmp = tmp_path_factory.mktemp("lora-reuse")
    with serving(tmp, SMALL + ["--enable-lora-updating", "--lora-modules", f"A={adapters / 'A'}",
                               "--lora-modules", f"B={adapters / 'B'}"]) as served:
        yield served


def ask(server, client, model: str, system: str) -> dict:
    r = client.chat.completions.create(
        model=server.model if model == "base" else model, max_tokens=8, temperature=0, logprobs=True,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "what comes next?"}],
        extra_body={"ignore_eos": True, "return_token_ids": True})
    c = r.choices[0]
    return {"tokens": list(c.token_ids), "logprobs": [t.logprob for t in c.logprobs.content],
            "cached": r.usage.prompt_tokens_details.cached_tokens, "model": r.model}


def assert_same_answer(warm: dict, cold: dict) -> None:
    assert warm["tokens"] == cold["tokens"]
    assert max(abs(a - b) for a, b in zip(warm["logprobs"], cold["logprobs"])) < 1e-3


def done_lines(server) -> list[dict]:
    return [json.loads(line[line.index("{"):]) for line in server.err.read_text().splitlines()
            if '"event":"done"' in line]


def post(server, path: str, body: dict):
    return http("POST", server.url + path, json.dumps(body).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})


def test_each_adapter_resumes_only_its_own_state_from_every_tier_with_its_cold_answer(tiers):
    server, client = tiers
    systems = [f"Order {i}: " + text(300, 700 + i) for i in range(len(ORDERS))]
    before = len(done_lines(server))
    cold = {}
    for system, order in zip(systems, ORDERS):
        for model in order:  # the same prompt seen under the others first: nothing of this one's
            cold[system, model] = ask(server, client, model, system)
            assert cold[system, model]["cached"] == 0, (order, model)
    answers = {system: {cold[system, m]["tokens"][0] for m in order} for system, order in zip(systems, ORDERS)}
    assert all(len(firsts) == 3 for firsts in answers.values())  # each adapter does change the answer
    for system, order in zip(systems, ORDERS):
        for model in reversed(order):
            warm = ask(server, client, model, system)
            assert warm["cached"] > 0 and warm["model"] == (server.model if model == "base" else model)
            assert_same_answer(warm, cold[system, model])
    done = done_lines(server)[before:]
    warm_tiers = {d["tier"] for d in done[9:]}
    assert warm_tiers & {"kv_ram", "kv_disk"}, warm_tiers  # the pool keeps about one prompt: most come from below
    assert [d.get("adapter") for d in done[:3]] == [None if m == "base" else m for m in ORDERS[0]]


def test_another_file_loaded_under_an_unloaded_name_resumes_nothing_of_the_old_one(tiers, adapters):
    server, client = tiers
    system = "Swap: " + text(300, 900)
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "X", "lora_path": str(adapters / "A")}).status == 200
    old = ask(server, client, "X", system)
    assert ask(server, client, "X", system)["cached"] > 0  # its own state is resumed
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "X"}).status == 200
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "X", "lora_path": str(adapters / "C")}).status == 200
    new = ask(server, client, "X", system)
    assert new["cached"] == 0 and new["tokens"] != old["tokens"]
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "Y", "lora_path": str(adapters / "C")}).status == 200
    reference = ask(server, client, "Y", system)  # C's files under another name: a cold run of C
    assert reference["cached"] == 0
    assert_same_answer(new, reference)
    assert_same_answer(ask(server, client, "X", system), reference)  # and C's state is resumed as C's
    for name in ("X", "Y"):
        assert post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status == 200


def test_an_adapter_gone_bad_is_dropped_at_the_reload_and_its_name_freed(tmp_path, adapters):
    flagged = shutil.copytree(adapters / "A", tmp_path / "flagged")
    late = shutil.copytree(adapters / "B", tmp_path / "late")
    argv = ["--kv-pool-tokens", "8192", "--decode-lanes", "2", "--api-key", API_KEY, "--enable-lora-updating",
            "--idle-unload-s", "3", "--lora-modules", f"F={flagged}"]
    with serving(tmp_path, argv) as (server, client):
        def complete(model):
            return post(server, "/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 2})

        def listed():
            return {m.id for m in client.models.list().data}

        def unloaded():
            """The model is unloaded now: each of its loads was followed by an (idle) unload."""
            log = server.err.read_text()
            return log.count("unloaded model") >= log.count(f"model {server.model} loaded from")

        def load_adapter(name, path):
            """A load, after a request that loads the default model (it may idle out before the load comes)."""
            deadline = time.monotonic() + 60
            while True:
                assert complete(server.model).status == 200
                r = post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
                if r.status != 400 or "not loaded" not in r.json()["error"]["message"]:
                    return r
                assert time.monotonic() < deadline, r.body

        assert load_adapter("Z", late).status == 200
        assert complete("F").status == 200 and complete("Z").status == 200
        for spoiled in (flagged, late):
            (spoiled / "adapter_config.json").write_text("{not json")
        # the idle unload: the files are read again at the next load
        wait_until(unloaded, 60, "the model was not unloaded when idle", every=0.1)
        assert complete(server.model).status == 200  # the reload drops both, and the base model serves
        # gateways follow the engine's list within about a second
        wait_until(lambda: not listed() & {"F", "Z"}, 30, "the dropped adapters are still listed", every=0.1)
        assert complete("F").status == 404
        assert load_adapter("F", adapters / "C").status == 200
        assert complete("F").status == 200 and "F" in listed()
