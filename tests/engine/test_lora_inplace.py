"""In-place LoRA loads (vLLM's ``load_inplace``, engine.lora_updates) against a tiny model.

A load with ``inplace`` of a served name, a ``--lora-modules`` one or one
loaded at run time, reads the new files off the loop as any load, then
replaces that adapter's weights in its slot between rounds: its identity (name
and digest, which scopes prompt reuse) is the new files', the layers hold the
new tensors only, the registry's path for the name is the new one (a reload
reads it) and the version moves. Of a name not served it is a plain load.
Refused, the old adapter serves on untouched: files that do not read, a
model's name, a plain load of a taken name, and requests in flight that name
the adapter, whether they were there when it was asked or came while the
files were read.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from ignis.engine.config import EngineConfig
from ignis.engine.lora_updates import AdapterRegistry, LoraUpdates
from ignis.engine.models.build import load_model
from ignis.engine.models.lora import CONFIG_FILE, LoraLinear, read_adapter
from ignis.engine.runtime import _attach_adapters
from ignis.shared.model_names import model_specs
from ignis.shared.wire import AdapterList, AdapterUpdated, ListAdapters, LoadAdapter
from tests.engine.checkpoints import make_checkpoint
from tests.engine.lora_adapters import write_adapter
from tests.engine.test_lora_updates import Runtime, load, serve_until_read


@pytest.fixture
def serving(tmp_path):
    """An engine's view: the default model with ``flagged`` (``--lora-modules``, files of ``a``) and ``late``
    (loaded at run time, files of ``b``); ``c`` adapts other layers than ``a`` does."""
    ckpt = make_checkpoint(tmp_path, "qwen3_5")
    write_adapter(tmp_path / "a", ckpt.model, seed=1)
    write_adapter(tmp_path / "b", ckpt.model, seed=2)
    write_adapter(tmp_path / "c", ckpt.model, seed=3, targets=r"(q_proj|down_proj)$")
    shutil.copytree(tmp_path / "a", tmp_path / "spoiled")
    (tmp_path / "spoiled" / CONFIG_FILE).write_text("{not json")
    config = EngineConfig(model=(str(ckpt.path),))
    default = model_specs(config.model, config.served_model_name)[0][0]
    registry = AdapterRegistry([("flagged", str(tmp_path / "a"))])

    def reload() -> Runtime:
        """The default model loaded again, with the registry's adapters (as the engine's loader does)."""
        model, _ = load_model(ckpt.path)
        _attach_adapters(config, default, model, registry.specs())
        return Runtime(model)

    runtime = reload()
    sent = []
    updates = LoraUpdates(True, registry, 64, [default], lambda msg, peer: sent.append(msg))
    load(updates, runtime, LoadAdapter("0", "late", str(tmp_path / "b")), sent)
    assert sent[-1].ok and runtime.lora.slot("flagged") == 0 and runtime.lora.slot("late") == 1
    return runtime, registry, updates, reload, sent, tmp_path, default


def weights_in(runtime, slot: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) of adapter ``slot`` on each layer it adapts, as served."""
    return {name: m.adapters[slot][:2] for name, m in runtime.runner.model.named_modules()
            if isinstance(m, LoraLinear) and slot in m.adapters}


def expected(runtime, path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) per layer of the adapter at ``path``, in the model's dtype."""
    model = runtime.runner.model
    dtype = next(model.parameters()).dtype
    return {m: (a.to(dtype), b.to(dtype)) for m, (a, b) in read_adapter("x", path, model, 64).weights.items()}


def same_tensors(a: dict, b: dict) -> bool:
    """The same layers holding the very same tensor objects (nothing was put in or copied)."""
    return a.keys() == b.keys() and all(x is y for m in a for x, y in zip(a[m], b[m]))


def assert_serves(runtime, slot: int, path) -> None:
    got, want = weights_in(runtime, slot), expected(runtime, path)
    assert set(got) == set(want)
    assert all(torch.equal(got[m][0], want[m][0]) and torch.equal(got[m][1], want[m][1]) for m in want)


@pytest.mark.parametrize("name, slot", [("flagged", 0), ("late", 1)])
def test_an_inplace_load_replaces_the_weights_in_the_slot_and_the_registry_path(serving, name, slot):
    runtime, registry, updates, reload, sent, root, _ = serving
    lora = runtime.lora
    first = lora.identity(slot)
    other = 1 - slot
    other_identity, other_weights = lora.identity(other), weights_in(runtime, other)
    load(updates, runtime, LoadAdapter("1", name, str(root / "c"), inplace=True), sent)
    assert sent[-1] == AdapterUpdated("1", True, f"LoRA adapter {name!r} replaced in place")
    assert runtime.lora is lora and lora.slot(name) == slot
    assert lora.identity(slot) != first and lora.identity(slot).startswith(f"{name}@")  # reuse starts afresh
    assert_serves(runtime, slot, root / "c")  # the layers only the old files adapted keep nothing of them
    assert lora.identity(other) == other_identity and same_tensors(weights_in(runtime, other), other_weights)
    paths = {"flagged": str(root / "a"), "late": str(root / "b"), name: str(root / "c")}
    assert registry.specs() == [("flagged", paths["flagged"], False), ("late", paths["late"], False)]
    assert registry.version == 2  # the run-time load, then this one: gateways take the new path
    updates.list(b"gw", ListAdapters("2"))
    assert sent[-1] == AdapterList("2", 2, ("flagged", "late"), (paths["flagged"], paths["late"]))
    again = reload()  # an idle unload and reload reads the new files
    assert again.lora.identity(again.lora.slot(name)) == lora.identity(slot)
    load(updates, runtime, LoadAdapter("3", name, str(root / ("a" if name == "flagged" else "b")),
                                       inplace=True), sent)
    assert sent[-1].ok and lora.identity(slot) == first  # the first files again: the first identity


def test_an_inplace_load_of_a_name_not_served_is_a_plain_load(serving):
    runtime, registry, updates, _, sent, root, _ = serving
    load(updates, runtime, LoadAdapter("1", "fresh", str(root / "c"), inplace=True), sent)
    assert sent[-1] == AdapterUpdated("1", True, "LoRA adapter 'fresh' added")
    assert runtime.lora.slot("fresh") == 2 and registry.specs()[-1] == ("fresh", str(root / "c"), False)
    assert_serves(runtime, 2, root / "c")


@pytest.mark.parametrize("case, message", [
    ("unreadable", "adapter_config.json"),
    ("plain", "already loaded (load_inplace: true replaces its weights)"),
    ("model_name", "already names a served model"),
    ("in_use_when_asked", "in use by 2 requests in flight"),
    ("in_use_when_read", "in use by 1 request in flight"),
    ("not_loaded", "default model is not loaded"),
])
def test_a_refused_inplace_load_leaves_the_old_adapter_serving_untouched(serving, case, message):
    runtime, registry, updates, _, sent, root, default = serving
    before = (registry.specs(), registry.version, runtime.lora.identity(1))
    served = weights_in(runtime, 1)
    in_flight = {"late": 2 if case == "in_use_when_asked" else 0}
    msg = LoadAdapter("1", "late", str(root / ("spoiled" if case == "unreadable" else "c")), inplace=case != "plain")
    if case == "model_name":
        msg = LoadAdapter("1", default, str(root / "c"), inplace=True)
    updates.handle(b"gw", msg, runtime, case != "not_loaded", lambda n: in_flight.get(n, 0))
    if case == "in_use_when_read":
        assert updates.reading
        in_flight["late"] = 1  # a request came while the files were read
    serve_until_read(updates, runtime)
    assert any(m.id == "1" for m in sent), "the load was never answered"
    assert not sent[-1].ok and message in sent[-1].message
    assert (registry.specs(), registry.version, runtime.lora.identity(1)) == before
    assert same_tensors(weights_in(runtime, 1), served)
    assert_serves(runtime, 1, root / "b")
