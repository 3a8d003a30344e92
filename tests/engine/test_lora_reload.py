"""An adapter whose files went bad while serving, at the default model's next load (an idle unload, a switch).

The reload drops it with a warning, whether ``--lora-modules`` gave it or it
was loaded at run time, and never fails (the base model and the other
adapters keep serving); the registry then lets it go too: the list gateways
take no longer names it, its version moves so they notice, and its name can
be loaded again. A reload that reads every adapter changes nothing.
"""

from __future__ import annotations

import shutil

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.lora_updates import AdapterRegistry, LoraUpdates
from ignis.engine.models.build import load_model
from ignis.engine.models.lora import CONFIG_FILE
from ignis.engine.runtime import _attach_adapters
from ignis.shared.model_names import model_specs
from ignis.shared.wire import AdapterList, ListAdapters, LoadAdapter
from tests.engine.checkpoints import make_checkpoint
from tests.engine.lora_adapters import write_adapter
from tests.engine.test_lora_updates import Runtime, load


@pytest.fixture
def serving(tmp_path):
    """An engine's view at start: the default model with adapter ``flagged`` (``--lora-modules``), and
    ``late`` loaded at run time; both directories are copies the test may spoil."""
    ckpt = make_checkpoint(tmp_path, "qwen3_5")
    write_adapter(tmp_path / "good", ckpt.model, seed=1)
    for name in ("flagged", "late"):
        shutil.copytree(tmp_path / "good", tmp_path / name)
    config = EngineConfig(model=(str(ckpt.path),))
    default = model_specs(config.model, config.served_model_name)[0][0]
    registry = AdapterRegistry([("flagged", str(tmp_path / "flagged"))])

    def reload() -> Runtime:
        """The default model loaded again, with the registry's adapters (as the engine's loader does)."""
        model, _ = load_model(ckpt.path)
        _attach_adapters(config, default, model, registry.specs())
        return Runtime(model)

    runtime = reload()  # at start, before the engine serves
    sent = []
    updates = LoraUpdates(True, registry, 64, [default], lambda msg, peer: sent.append(msg))
    load(updates, runtime, LoadAdapter("1", "late", str(tmp_path / "late")), sent)
    assert sent[-1].ok and runtime.lora.slot("flagged") == 0 and runtime.lora.slot("late") == 1
    return registry, updates, reload, sent, tmp_path


@pytest.mark.parametrize("spoiled", [("flagged",), ("late",), ("flagged", "late")])
def test_a_reload_drops_an_adapter_gone_bad_and_the_registry_lets_it_go(serving, spoiled):
    registry, updates, reload, sent, root = serving
    for name in spoiled:
        (root / name / CONFIG_FILE).write_text("{not json")
    version = registry.version
    runtime = reload()  # no CheckpointError: a --lora-modules adapter fails only the start
    kept = [n for n in ("flagged", "late") if n not in spoiled]
    assert sorted(runtime.lora.slots) == kept
    updates.service(runtime, True)
    assert [n for n, _, _ in registry.specs()] == kept and registry.version == version + 1
    updates.list(b"gw", ListAdapters("2"))
    assert sent[-1] == AdapterList("2", version + 1, tuple(kept), tuple(str(root / n) for n in kept))
    updates.service(runtime, True)  # once per load: nothing more moves
    assert registry.version == version + 1
    # the name is free again: a good adapter loads under it
    load(updates, runtime, LoadAdapter("3", spoiled[0], str(root / "good")), sent)
    assert sent[-1].ok and runtime.lora.slot(spoiled[0]) is not None


def test_a_reload_that_reads_every_adapter_changes_nothing(serving):
    registry, updates, reload, sent, root = serving
    before, version = registry.specs(), registry.version
    runtime = reload()
    updates.service(runtime, True)
    assert registry.specs() == before and registry.version == version
    assert sorted(runtime.lora.slots) == ["flagged", "late"]


def test_a_bad_lora_modules_adapter_still_fails_the_start(tmp_path):
    """Before the engine serves, an adapter given by --lora-modules is required: its load raises."""
    from ignis.engine.models.checkpoint_error import CheckpointError

    ckpt = make_checkpoint(tmp_path, "qwen3_5")
    write_adapter(tmp_path / "bad", ckpt.model, seed=1)
    (tmp_path / "bad" / CONFIG_FILE).write_text("{not json")
    config = EngineConfig(model=(str(ckpt.path),))
    registry = AdapterRegistry([("bad", str(tmp_path / "bad"))])
    with pytest.raises(CheckpointError, match="cannot read adapter_config.json"):
        _attach_adapters(config, model_specs(config.model, config.served_model_name)[0][0],
                         load_model(ckpt.path)[0], registry.specs())
