"""Runtime LoRA loads and unloads (engine.lora_updates) against a tiny model, with stand-ins for the server.

Each refusal changes nothing and says why: updating off, the default model
not loaded, a name taken by a model or an adapter, an adapter that does not
read, an unload of an adapter in use or unknown. A load serves the adapter at
once (its rows take it) and is kept in the registry a reload reads; an unload
stops it and lets go of the lanes that ran it.
"""

from __future__ import annotations

import pytest

from ignis.engine.lora_updates import AdapterRegistry, LoraUpdates
from ignis.engine.models.build import load_model
from ignis.engine.models.lora import LoraLinear
from ignis.shared.wire import AdapterList, AdapterUpdated, ListAdapters, LoadAdapter, UnloadAdapter
from tests.engine.checkpoints import make_checkpoint
from tests.engine.lora_adapters import write_adapter


class Runtime:
    """The engine's runtime as the updates see it: a real runner over the model."""

    def __init__(self, model):
        from ignis.engine.runner import ModelRunner
        from tests.engine.test_model_forward import new_state

        self.runner = ModelRunner(model, new_state(model))

    @property
    def lora(self):
        return self.runner.model.lora


@pytest.fixture
def setup(tmp_path):
    ckpt = make_checkpoint(tmp_path, "qwen3_5")
    write_adapter(tmp_path / "a", ckpt.model, seed=1)
    write_adapter(tmp_path / "b", ckpt.model, seed=2, targets=r"(q_proj|down_proj)$")
    model, _ = load_model(ckpt.path)
    sent = []
    registry = AdapterRegistry([])
    updates = LoraUpdates(True, registry, 64, ["base"], lambda msg, peer: sent.append(msg))
    return Runtime(model), registry, updates, sent, tmp_path


def test_a_load_serves_the_adapter_and_the_registry_keeps_it(setup):
    runtime, registry, updates, sent, root = setup
    updates.handle(b"gw", LoadAdapter("1", "a", str(root / "a")), runtime, True, lambda n: 0)
    assert sent[-1] == AdapterUpdated("1", True, "LoRA adapter 'a' added")
    lora = runtime.runner.model.lora
    assert runtime.runner.lora is lora and lora.slot("a") == 0
    assert any(isinstance(m, LoraLinear) for m in runtime.runner.model.modules())
    updates.handle(b"gw", LoadAdapter("2", "b", str(root / "b")), runtime, True, lambda n: 0)
    assert sent[-1].ok and lora.slot("b") == 1
    assert registry.specs() == [("a", str(root / "a"), False), ("b", str(root / "b"), False)]
    lora.assign(3, lora.slot("a"))
    updates.handle(b"gw", UnloadAdapter("3", "a"), runtime, True, lambda n: 0)
    assert sent[-1].ok and lora.slot("a") is None and not lora.takes([3])
    assert registry.specs() == [("b", str(root / "b"), False)]
    assert all(0 not in m.adapters for m in runtime.runner.model.modules() if isinstance(m, LoraLinear))
    updates.handle(b"gw", LoadAdapter("4", "c", str(root / "a")), runtime, True, lambda n: 0)
    assert lora.slot("c") == 0  # the freed slot is taken again
    assert registry.version == 4  # three loads and an unload: what gateways watch in the Stats
    updates.list(b"gw", ListAdapters("5"))
    assert sent[-1] == AdapterList("5", 4, ("b", "c"), (str(root / "b"), str(root / "a")))


@pytest.mark.parametrize("case, message", [
    ("off", "--enable-lora-updating"),
    ("not_loaded", "default model is not loaded"),
    ("model_name", "already names a served model"),
    ("taken", "already loaded"),
    ("unreadable", "adapter_config.json"),
    ("in_use", "in use by 2 requests"),
    ("unknown", "cannot be found"),
])
def test_a_refused_update_changes_nothing_and_says_why(setup, case, message):
    runtime, registry, updates, sent, root = setup
    updates.handle(b"gw", LoadAdapter("0", "a", str(root / "a")), runtime, True, lambda n: 0)
    before = registry.specs()
    msg, default_loaded, users = LoadAdapter("1", "b", str(root / "b")), True, (lambda n: 0)
    if case == "off":
        updates.enabled = False
    elif case == "not_loaded":
        default_loaded = False
    elif case == "model_name":
        msg = LoadAdapter("1", "base", str(root / "b"))
    elif case == "taken":
        msg = LoadAdapter("1", "a", str(root / "b"))
    elif case == "unreadable":
        msg = LoadAdapter("1", "b", str(root))
    elif case == "in_use":
        msg, users = UnloadAdapter("1", "a"), (lambda n: 2 if n == "a" else 0)
    elif case == "unknown":
        msg = UnloadAdapter("1", "zzz")
    updates.handle(b"gw", msg, runtime, default_loaded, users)
    assert not sent[-1].ok and message in sent[-1].message and sent[-1].missing == (case == "unknown")
    assert registry.specs() == before and runtime.lora.slot("a") == 0 and runtime.lora.slot("b") is None
    assert registry.version == 1  # the one load before: a refusal moves nothing gateways watch
