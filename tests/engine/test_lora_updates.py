"""Runtime LoRA loads and unloads (engine.lora_updates) against a tiny model, with stand-ins for the server.

Each refusal changes nothing and says why: updating off, the default model
not loaded, a name taken by a model or an adapter, an adapter that does not
read, an unload of an adapter in use or unknown. A load's files are read off
the loop; once read, the next ``service`` serves the adapter (its rows take
it) and the registry keeps it for a reload; an unload stops it and lets go of
the lanes that ran it.
"""

from __future__ import annotations

import threading
import time

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


def load(updates, runtime, msg, sent, default_loaded=True):
    """Ask for a load and serve the loop until it is answered (the read runs on the reader thread)."""
    updates.handle(b"gw", msg, runtime, default_loaded, lambda n: 0)
    deadline = time.monotonic() + 30
    while not any(getattr(m, "id", None) == msg.id for m in sent):
        assert time.monotonic() < deadline, "the load was never answered"
        updates.service(runtime, default_loaded)
        time.sleep(0.01)


def serve_until_read(updates, runtime, default_loaded=True):
    """Serve the loop until every load asked has been read and answered (or dropped)."""
    deadline = time.monotonic() + 30
    while updates.reading:
        assert time.monotonic() < deadline, "a load was never read"
        updates.service(runtime, default_loaded)
        time.sleep(0.01)


@pytest.fixture
def held_reads(monkeypatch):
    """Reads of adapter files wait until the returned event is set (a large adapter on a slow disk)."""
    from ignis.engine.models import lora as lora_module

    release = threading.Event()
    real = lora_module.read_adapter

    def slow(*args, **kwargs):
        assert threading.current_thread() is not threading.main_thread()  # never the loop's
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(lora_module, "read_adapter", slow)
    return release


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
    load(updates, runtime, LoadAdapter("1", "a", str(root / "a")), sent)
    assert sent[-1] == AdapterUpdated("1", True, "LoRA adapter 'a' added")
    lora = runtime.runner.model.lora
    assert runtime.runner.lora is lora and lora.slot("a") == 0
    assert any(isinstance(m, LoraLinear) for m in runtime.runner.model.modules())
    load(updates, runtime, LoadAdapter("2", "b", str(root / "b")), sent)
    assert sent[-1].ok and lora.slot("b") == 1
    assert registry.specs() == [("a", str(root / "a"), False), ("b", str(root / "b"), False)]
    lora.assign(3, lora.slot("a"))
    updates.handle(b"gw", UnloadAdapter("3", "a"), runtime, True, lambda n: 0)
    assert sent[-1].ok and lora.slot("a") is None and not lora.takes([3])
    assert registry.specs() == [("b", str(root / "b"), False)]
    assert all(0 not in m.adapters for m in runtime.runner.model.modules() if isinstance(m, LoraLinear))
    load(updates, runtime, LoadAdapter("4", "c", str(root / "a")), sent)
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
    load(updates, runtime, LoadAdapter("0", "a", str(root / "a")), sent)
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
    if isinstance(msg, LoadAdapter):
        load(updates, runtime, msg, sent, default_loaded)
    else:
        updates.handle(b"gw", msg, runtime, default_loaded, users)
    assert not sent[-1].ok and message in sent[-1].message and sent[-1].missing == (case == "unknown")
    assert registry.specs() == before and runtime.lora.slot("a") == 0 and runtime.lora.slot("b") is None
    assert registry.version == 1  # the one load before: a refusal moves nothing gateways watch


def test_the_files_are_read_off_the_loop_and_the_adapter_put_in_between_rounds(setup, held_reads):
    """A large adapter takes seconds to read and check: the loop goes on meanwhile, the name is reserved,
    and an adapter read for a model that was unloaded meanwhile is refused."""
    runtime, registry, updates, sent, root = setup
    release = held_reads
    updates.handle(b"gw", LoadAdapter("1", "a", str(root / "a")), runtime, True, lambda n: 0)
    assert sent == [] and updates.reading  # handle returned: the loop runs rounds meanwhile
    updates.service(runtime, True)
    assert sent == [] and runtime.lora is None
    updates.handle(b"gw", LoadAdapter("2", "a", str(root / "b")), runtime, True, lambda n: 0)
    assert not sent[-1].ok and "being loaded" in sent[-1].message
    updates.handle(b"gw", UnloadAdapter("3", "a"), runtime, True, lambda n: 0)
    assert not sent[-1].ok and "still being loaded" in sent[-1].message
    release.set()
    serve_until_read(updates, runtime)
    assert sent[-1] == AdapterUpdated("1", True, "LoRA adapter 'a' added") and runtime.lora.slot("a") == 0
    # read while the default model went away: refused, nothing put in
    load(updates, runtime, LoadAdapter("4", "b", str(root / "b")), sent, default_loaded=False)
    assert not sent[-1].ok and "default model is not loaded" in sent[-1].message
    release.clear()
    updates.handle(b"gw", LoadAdapter("5", "b", str(root / "b")), runtime, True, lambda n: 0)
    other = Runtime(load_model(make_checkpoint(root / "other", "qwen3_5").path)[0])
    release.set()
    serve_until_read(updates, other)  # the model in service now is another one
    assert not sent[-1].ok and "unloaded while the adapter was read" in sent[-1].message
    assert registry.specs() == [("a", str(root / "a"), False)] and runtime.lora.slot("b") is None


def test_loads_queued_behind_a_read_are_answered_when_the_model_goes_and_when_the_engine_stops(setup, held_reads):
    """A switch or idle unload drops the model while loads wait: each is refused as unloaded (no traceback,
    and the model is not kept alive for them); an engine that stops answers every load still waiting."""
    import gc

    runtime, registry, updates, sent, root = setup
    release = held_reads
    updates.handle(b"gw", LoadAdapter("1", "a", str(root / "a")), runtime, True, lambda n: 0)
    updates.handle(b"gw", LoadAdapter("2", "b", str(root / "b")), runtime, True, lambda n: 0)
    runtime.runner = None  # the unload (Runtime.close): the model is let go
    gc.collect()
    release.set()
    serve_until_read(updates, None, default_loaded=False)
    answers = {m.id: m for m in sent}
    assert set(answers) == {"1", "2"} and not any(m.ok for m in answers.values())
    assert all("unloaded while the adapter was read" in m.message for m in answers.values()), answers
    # the engine stopping: loads asked and not yet put in are answered at once
    release.clear()
    fresh = Runtime(load_model(make_checkpoint(root / "other", "qwen3_5").path)[0])
    updates.handle(b"gw", LoadAdapter("3", "a", str(root / "a")), fresh, True, lambda n: 0)
    updates.handle(b"gw", LoadAdapter("4", "b", str(root / "b")), fresh, True, lambda n: 0)
    updates.refuse_all("the engine is shutting down")
    assert [(m.id, m.ok, m.message) for m in sent[-2:]] == [("3", False, "the engine is shutting down"),
                                                           ("4", False, "the engine is shutting down")]
    release.set()
    serve_until_read(updates, fresh)  # the read in progress ends and is dropped, never answered twice
    assert [m.id for m in sent].count("3") == 1 and fresh.lora is None
