"""vLLM's ``load_inplace`` on ``POST /v1/load_lora_adapter`` through HTTP.

``ignis serve`` with adapter X (``--lora-modules``, A's files): a bad
in-place file is a 400 and X answers as before (its state resumed); a plain
load of the taken name and a ``load_inplace`` that is not a JSON boolean are
400s. X replaced in place with C's files resumes nothing of A's state and
answers as C cold does (C's files under another name), ``/v1/models`` names
C's directory as its root; put back to A's files it answers as A again.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from ignis.shared.demo import ensure_demo_model
from tests.engine.lora_adapters import write_adapter
from tests.gateway.conftest import API_KEY
from tests.gateway.test_lora_reuse_http import ask, assert_same_answer, post, serving
from tests.gateway.test_reuse_http import text


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Adapters A and C of the demo model, each changing its answers, and ``spoiled`` (A's, config broken)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-inplace-adapters")
    model = AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.float32).eval()
    for name, seed in (("A", 3), ("C", 11)):
        write_adapter(root / name, model, rank=8, alpha=16.0, seed=seed, spread=2.0)
    shutil.copytree(root / "A", root / "spoiled")
    (root / "spoiled" / "adapter_config.json").write_text("{not json")
    return root


def test_an_inplace_load_swaps_the_weights_and_never_resumes_the_old_ones(tmp_path, adapters):
    argv = ["--kv-pool-tokens", "8192", "--decode-lanes", "2", "--api-key", API_KEY, "--enable-lora-updating",
            "--lora-modules", f"X={adapters / 'A'}"]
    with serving(tmp_path, argv) as (server, client):
        def load(name, path, **extra):
            return post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), **extra})

        system = "In place: " + text(300, 950)
        first = ask(server, client, "X", system)
        assert first["cached"] == 0
        r = load("X", adapters / "spoiled", load_inplace=True)
        assert r.status == 400 and "adapter_config.json" in r.json()["error"]["message"]
        kept = ask(server, client, "X", system)
        assert kept["cached"] > 0  # A still serves, its state resumed
        assert_same_answer(kept, first)
        r = load("X", adapters / "C", load_inplace="yes")
        assert r.status == 400 and r.json()["error"]["param"] == "load_inplace"
        r = load("X", adapters / "C")
        assert r.status == 400 and "already loaded" in r.json()["error"]["message"]
        assert load(server.model, adapters / "C", load_inplace=True).status == 400  # a model's name

        r = load("X", adapters / "C", load_inplace=True)
        assert r.status == 200 and r.body == b"Success: LoRA adapter 'X' added successfully."
        assert client.models.retrieve("X").model_dump()["root"] == str(adapters / "C")
        swapped = ask(server, client, "X", system)
        assert swapped["cached"] == 0 and swapped["tokens"] != first["tokens"]
        assert load("Y", adapters / "C").status == 200
        cold_c = ask(server, client, "Y", system)  # C's files under another name: a cold run of C
        assert cold_c["cached"] == 0
        assert_same_answer(swapped, cold_c)

        assert load("X", adapters / "A", load_inplace=True).status == 200
        back = ask(server, client, "X", system)  # A's files again: A's state may be resumed, A's answer
        assert_same_answer(back, first)
