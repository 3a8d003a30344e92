"""An adapter's files are read safely (engine.models.lora): refused at once, naming the adapter, never read past
a bound, and the refusal reaches whoever asked.

A FIFO or a device as a file is refused without waiting on it; a weights file
larger than any valid adapter of the model is refused before it is read; a
config nested too deep to parse is a refusal at run time, a warning at a
reload, and a one-line start error (exit code 2) at start; NaN weights are
refused naming the tensor; log lines quote the names and paths clients give.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading

import pytest

from ignis.engine.config import EngineConfig
from ignis.engine.lora_updates import AdapterRegistry, LoraUpdates
from ignis.engine.models.build import load_model
from ignis.engine.models.checkpoint_error import CheckpointError
from ignis.engine.models.lora import CONFIG_FILE, MAX_CONFIG_BYTES, WEIGHTS_FILE, max_weights_bytes, read_adapter
from ignis.engine.runtime import _attach_adapters
from ignis.shared.model_names import model_specs
from ignis.shared.wire import AdapterUpdated, LoadAdapter
from tests.engine.checkpoints import make_checkpoint
from tests.engine.lora_adapters import DEFAULT_TARGETS, write_adapter
from tests.engine.test_lora_updates import Runtime, load

RANK = 4
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny checkpoint, its served model and a good adapter of it."""
    root = tmp_path_factory.mktemp("lora-files")
    ckpt = make_checkpoint(root, "qwen3_5")
    write_adapter(root / "good", ckpt.model, rank=RANK, seed=1)
    model, _ = load_model(ckpt.path)
    return ckpt, model, root


@pytest.fixture
def adapter(base, tmp_path):
    """A fresh copy of the good adapter, to spoil."""
    _, _, root = base
    return shutil.copytree(root / "good", tmp_path / "adapter")


def _refusal_within(seconds: float, *args) -> CheckpointError:
    """``read_adapter(*args)``'s CheckpointError, which must come within ``seconds`` (a blocked read fails)."""
    caught = []

    def read():
        try:
            read_adapter(*args)
        except CheckpointError as exc:
            caught.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    assert not reader.is_alive(), "read_adapter blocked"
    assert caught, "read_adapter did not refuse"
    return caught[0]


@pytest.mark.parametrize("which", [CONFIG_FILE, WEIGHTS_FILE])
def test_a_fifo_is_refused_at_once(base, adapter, which):
    _, model, _ = base
    (adapter / which).unlink()
    os.mkfifo(adapter / which)
    err = _refusal_within(10, "fifo", adapter, model, 64)
    assert f"LoRA adapter fifo ({adapter}): {which} is not a regular file" == str(err)


@pytest.mark.parametrize("target", ["/dev/zero", "dir"])
def test_a_device_or_a_directory_is_refused_unread(base, adapter, target):
    _, model, _ = base
    (adapter / CONFIG_FILE).unlink()
    if target == "dir":
        (adapter / CONFIG_FILE).mkdir()
    else:
        (adapter / CONFIG_FILE).symlink_to(target)
    err = _refusal_within(10, "dev", adapter, model, 64)
    assert f"{CONFIG_FILE} is not a regular file" in str(err)


def test_a_symlinked_adapter_file_is_read(base, adapter, tmp_path):
    _, model, _ = base
    (adapter / WEIGHTS_FILE).rename(tmp_path / "blob")
    (adapter / WEIGHTS_FILE).symlink_to(tmp_path / "blob")  # as the Hugging Face cache lays files out
    assert read_adapter("linked", adapter, model, 64).rank == RANK


def test_a_weights_file_past_the_largest_valid_adapter_is_refused_before_it_is_read(base, adapter):
    _, model, _ = base
    limit = max_weights_bytes(model, 8)
    with open(adapter / WEIGHTS_FILE, "r+b") as f:
        f.truncate(limit + 1)  # sparse: nothing is written
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_FILE} is {limit + 1} bytes, over its limit of {limit}"):
        read_adapter("big", adapter, model, 8)


def test_an_adapter_of_the_largest_rank_on_every_layer_fits_the_bound(base, tmp_path):
    ckpt, model, _ = base
    targets = DEFAULT_TARGETS.replace("(q_proj|", "(q_proj|k_proj|")
    write_adapter(tmp_path / "full", ckpt.model, rank=8, targets=targets)
    read = read_adapter("full", tmp_path / "full", model, 8)
    assert read.rank == 8 and len(read.weights) > 10
    assert (tmp_path / "full" / WEIGHTS_FILE).stat().st_size <= max_weights_bytes(model, 8)


def test_a_config_past_its_bound_is_refused(base, adapter):
    _, model, _ = base
    (adapter / CONFIG_FILE).write_text(json.dumps({"r": RANK, "lora_alpha": 8, "notes": "x" * MAX_CONFIG_BYTES}))
    with pytest.raises(CheckpointError, match=f"{CONFIG_FILE} is \\d+ bytes, over its limit of {MAX_CONFIG_BYTES}"):
        read_adapter("wordy", adapter, model, 64)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(base, adapter, value):
    from safetensors.torch import load_file, save_file

    _, model, _ = base
    tensors = load_file(str(adapter / WEIGHTS_FILE))
    key = sorted(tensors)[3]
    tensors[key][0, 0] = value
    save_file(tensors, str(adapter / WEIGHTS_FILE))
    with pytest.raises(CheckpointError, match="holds NaN or infinite values") as err:
        read_adapter("nan", adapter, model, 64)
    assert key in str(err.value)


def test_a_config_nested_too_deep_is_a_checkpoint_error(base, adapter):
    _, model, _ = base
    (adapter / CONFIG_FILE).write_text(DEEP_JSON)
    with pytest.raises(CheckpointError, match=f"LoRA adapter deep \\({adapter}\\): cannot read {CONFIG_FILE}"):
        read_adapter("deep", adapter, model, 64)


def test_a_run_time_load_of_a_deep_config_is_answered_and_changes_nothing(base, adapter):
    _, model, _ = base
    (adapter / CONFIG_FILE).write_text(DEEP_JSON)
    sent, registry = [], AdapterRegistry([])
    updates = LoraUpdates(True, registry, 64, ["base"], lambda msg, peer: sent.append(msg))
    runtime = Runtime(model)
    load(updates, runtime, LoadAdapter("1", "deep", str(adapter)), sent)  # read on the reader thread
    assert isinstance(sent[-1], AdapterUpdated) and not sent[-1].ok and CONFIG_FILE in sent[-1].message
    assert registry.specs() == [] and registry.version == 0
    assert runtime.lora is None or runtime.lora.slot("deep") is None


def test_a_reload_drops_a_run_time_adapter_whose_config_went_deep(base, adapter, caplog):
    ckpt, _, root = base
    config = EngineConfig(model=(str(ckpt.path),))
    name = model_specs(config.model, config.served_model_name)[0][0]
    model, _ = load_model(ckpt.path)
    (adapter / CONFIG_FILE).write_text(DEEP_JSON)
    with caplog.at_level(logging.WARNING, logger="ignis.engine"):
        _attach_adapters(config, name, model, [("good", str(root / "good"), True), ("late", str(adapter), False)])
    assert model.lora.slot("good") == 0 and model.lora.slot("late") is None
    assert any("'late' is dropped at this load" in r.getMessage() for r in caplog.records)
    with pytest.raises(CheckpointError, match="cannot read adapter_config.json"):  # one given by --lora-modules
        _attach_adapters(config, name, load_model(ckpt.path)[0], [("flagged", str(adapter), True)])


def test_a_deep_config_at_start_is_a_one_line_start_error(adapter, tmp_path):
    (adapter / CONFIG_FILE).write_text(DEEP_JSON)
    out = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "engine", "--runtime-dir", str(tmp_path / "rt"),
                          "--lora-modules", f"deep={adapter}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert f"ignis engine: LoRA adapter deep ({adapter}): cannot read {CONFIG_FILE}" in out.stderr


def test_log_lines_quote_the_names_and_paths_clients_give(base, adapter, caplog):
    _, model, _ = base
    sent = []
    updates = LoraUpdates(True, AdapterRegistry([]), 64, ["base"], lambda msg, peer: sent.append(msg))
    runtime = Runtime(model)
    with caplog.at_level(logging.INFO, logger="ignis.engine"):
        load(updates, runtime, LoadAdapter("1", "x\nFORGED line", str(adapter / "\x1b[31mnone")), sent)
        load(updates, runtime, LoadAdapter("2", "ok\x1b[2J", str(adapter)), sent)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line and "\x1b" not in line for line in lines), lines
    assert "'x\\nFORGED line' refused" in lines[0] and "'ok\\x1b[2J' loaded at run time" in lines[1]
