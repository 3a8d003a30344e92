"""LoRA adapters (vLLM's ``--lora-modules NAME=PATH``): PEFT directories served beside their base model.

An adapter directory holds ``adapter_config.json`` (``r``, ``lora_alpha``,
``use_rslora``, ``target_modules``) and ``adapter_model.safetensors`` with
``base_model.model.<module>.lora_A.weight`` [r, in] and ``.lora_B.weight``
[out, r] for each adapted linear layer. A request that names an adapter gets,
on every adapted layer ``W``,

    y = x W^T + scale * (x A^T) B^T          scale = alpha / r  (alpha / sqrt(r) with use_rslora)

on its own rows only: a batch mixes requests of several adapters and none,
and each row takes its lane's adapter (``LoraSet.assign``). An adapter is
loaded at start or at run time (``--enable-lora-updating``, ``LoraSet.add``)
and stays resident until unloaded (one slot each) or replaced in place
(``LoraSet.replace``: new files under the name, in its slot); the targeted
``nn.Linear`` layers of the model become ``LoraLinear`` (the base weight
untouched, so a request without an adapter runs exactly the base model).

What is refused at load, naming the adapter: a missing or unreadable file,
one that is not a regular file (a FIFO, a device, a directory; symlinks are
followed), a config over ``MAX_CONFIG_BYTES`` or one that does not parse
(nested too deep included), a weights file larger than any valid adapter of
the model can be (``max_weights_bytes``), weights as a pickle
(``adapter_model.bin``), DoRA, bias training, ``modules_to_save``, a rank
above ``--max-lora-rank``, a tensor for a module the model does not have or
that is not a linear layer (the MoE experts are stacked tensors, not layers:
an adapter of experts is refused), shapes that do not fit, an A without its
B, the embeddings or the LM head as targets, a tensor holding NaN or Inf in
the model's dtype. Each file is opened once and read through that descriptor,
checked and bounded before a byte is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ignis.engine.models.checkpoint_error import CheckpointError
from ignis.engine.models.weights_spec import classify

PEFT_PREFIX = "base_model.model."
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20
HEADER_BYTES_PER_LAYER = 1024
"""Room in the safetensors header for one layer's two entries (name, dtype, shape, offsets)."""
HEADER_BYTES = 1 << 20
"""Room in the safetensors header besides its entries (``__metadata__``, padding)."""


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter as read: its name, rank, scale and (A, B) per module path of the model."""

    name: str
    path: str
    rank: int
    scale: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    digest: str = ""
    """SHA-256 of the adapter's config and weights file: what its requests' reuse is scoped by, so state
    made under one adapter is never resumed under another that took its name (an adapter unloaded and
    another file loaded under it)."""

    @property
    def identity(self) -> str:
        return f"{self.name}@{self.digest}"


def read_adapter(name: str, path: str | Path, model: nn.Module, max_rank: int) -> LoraAdapter:
    """The adapter at ``path`` for ``model``, its tensors checked against the model's layers."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    where = f"LoRA adapter {name} ({path})"
    config = _read_regular_file(path / CONFIG_FILE, MAX_CONFIG_BYTES, where)
    try:
        cfg = json.loads(config)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; nesting too deep
        raise CheckpointError(f"{where}: cannot read {CONFIG_FILE} ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: {CONFIG_FILE} is not a JSON object")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if type(rank) is not int or rank < 1:
        raise CheckpointError(f"{where}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise CheckpointError(f"{where}: rank {rank} is above --max-lora-rank {max_rank}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise CheckpointError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None)), ("modules_to_save", (None, [])),
                         ("fan_in_fan_out", (False, None))):
        if cfg.get(key) not in allowed:
            raise CheckpointError(f"{where}: {key}={cfg.get(key)!r} is not supported")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise CheckpointError(f"{where}: per-module ranks (rank_pattern, alpha_pattern) are not supported")
    scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    file = path / WEIGHTS_FILE
    if not file.exists() and (path / "adapter_model.bin").is_file():
        raise CheckpointError(f"{where}: no {WEIGHTS_FILE} (weights as a pickle, adapter_model.bin, are not read: "
                              "convert them to safetensors)")
    data = _read_regular_file(file, max_weights_bytes(model, max_rank), where)  # read once: loaded and hashed
    try:
        raw = load(data)
    except SafetensorError as exc:
        raise CheckpointError(f"{where}: cannot read {WEIGHTS_FILE} ({exc})") from None
    dtype = next(model.parameters()).dtype  # what LoraSet.add serves the tensors in
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in raw.items():
        if not torch.isfinite(t.to(dtype)).all():
            raise CheckpointError(f"{where}: {key} holds NaN or infinite values (in the model's {dtype})")
        stem = key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if stem.endswith(suffix):
                kind = classify(stem[:-len(suffix)] + ".weight")
                if kind.kind == "expert":
                    raise CheckpointError(f"{where}: {key} adapts an MoE expert, which is not a linear layer "
                                          "(LoRA on MoE experts is not supported)")
                pairs.setdefault(kind.canonical.removesuffix(".weight"), {})[part] = t
                break
        else:
            raise CheckpointError(f"{where}: unexpected tensor {key}")
    if not pairs:
        raise CheckpointError(f"{where}: no lora_A / lora_B tensors")
    weights = {}
    for module, parts in sorted(pairs.items()):
        if module in ("lm_head", "embed_tokens"):
            raise CheckpointError(f"{where}: LoRA on {module} is not supported (only the decoder layers' linear "
                                  "layers)")
        if set(parts) != {"lora_A", "lora_B"}:
            raise CheckpointError(f"{where}: {module} has {', '.join(sorted(parts))} without its pair")
        try:
            layer = model.get_submodule(module)
        except AttributeError:
            raise CheckpointError(f"{where}: the model has no layer {module}") from None
        base = layer.base if isinstance(layer, LoraLinear) else layer
        if not isinstance(base, nn.Linear):
            raise CheckpointError(f"{where}: {module} is not a linear layer (LoRA on MoE experts is not supported)")
        a, b = parts["lora_A"], parts["lora_B"]
        if a.shape != (rank, base.in_features) or b.shape != (base.out_features, rank):
            raise CheckpointError(f"{where}: {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                                  f"a rank-{rank} adapter of a {base.in_features} -> {base.out_features} layer")
        weights[module] = (a, b)
    digest = hashlib.sha256(config + data).hexdigest()
    return LoraAdapter(name, str(path), rank, float(scale), weights, digest)


def max_weights_bytes(model: nn.Module, max_rank: int) -> int:
    """The largest ``adapter_model.safetensors`` a valid adapter of ``model`` can be: rank ``max_rank`` on
    every linear layer but the LM head, its A [r, in] and B [out, r] at 4 bytes an element, plus header room."""
    layers = [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]
    elements = sum(max_rank * (m.in_features + m.out_features) for m in layers)
    return 4 * elements + HEADER_BYTES_PER_LAYER * len(layers) + HEADER_BYTES


def _read_regular_file(file: Path, limit: int, where: str) -> bytes:
    """The bytes of ``file`` (symlinks followed), read through the one descriptor that was checked: anything
    but a regular file (a FIFO, a device, a directory) or more than ``limit`` bytes is refused unread."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once (blocking, it waits for a writer); a regular file ignores it
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no {file.name}") from None
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot read {file.name} ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{where}: {file.name} is not a regular file")
        if info.st_size > limit:
            raise CheckpointError(f"{where}: {file.name} is {info.st_size} bytes, over its limit of {limit}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot read {file.name} ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the check
        raise CheckpointError(f"{where}: {file.name} is over its limit of {limit} bytes")
    return data


class LoraRows:
    """The rows of the forward in progress that take each adapter: [(slot, row index tensor)], or None."""

    groups: list[tuple[int, torch.Tensor]] | None = None


class LoraLinear(nn.Module):
    """A linear layer plus, for the rows of each adapter that targets it, that adapter's low-rank update."""

    def __init__(self, base: nn.Linear, rows: LoraRows):
        super().__init__()
        self.base = base
        self.rows = rows
        self.adapters: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}  # slot -> (A, B, scale)

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        groups = self.rows.groups
        if groups:
            for slot, idx in groups:
                ab = self.adapters.get(slot)
                if ab is not None:
                    a, b, scale = ab
                    xs = x.index_select(0, idx)
                    y.index_add_(0, idx, torch.nn.functional.linear(torch.nn.functional.linear(xs, a), b),
                                 alpha=scale)
        return y


class LoraSet:
    """The adapters served with a model: their slots, the layers they adapt, and which lane takes which."""

    def __init__(self, model: nn.Module, adapters: list[LoraAdapter]):
        self.rows = LoraRows()
        self.model = model
        self.slots: dict[str, int] = {}
        self.by_slot: dict[int, LoraAdapter] = {}
        self._lane_slot: dict[int, int] = {}
        for adapter in adapters:
            self.add(adapter)
        model.lora = self

    @property
    def adapters(self) -> list[LoraAdapter]:
        return [self.by_slot[s] for s in sorted(self.by_slot)]

    def add(self, adapter: LoraAdapter) -> int:
        """Serve ``adapter`` (read against this model) in a free slot; its slot. Only between forwards."""
        if adapter.name in self.slots:
            raise CheckpointError(f"LoRA adapter {adapter.name} is already loaded")
        return self._put(adapter, next(i for i in range(len(self.by_slot) + 1) if i not in self.by_slot))

    def replace(self, adapter: LoraAdapter) -> int:
        """Serve ``adapter`` (read against this model) in place of the one of its name, in that one's slot;
        the slot. No request in flight may use the old one (the caller's check: lanes that ran it last are
        let go). The layers only the old one adapted keep no entry for the slot. Only between forwards."""
        slot = self.slots.get(adapter.name)
        if slot is None:
            raise CheckpointError(f"LoRA adapter {adapter.name} is not loaded")
        self.remove(adapter.name)
        return self._put(adapter, slot)

    def _put(self, adapter: LoraAdapter, slot: int) -> int:
        weight = next(self.model.parameters())
        for module, (a, b) in adapter.weights.items():
            layer = self.model.get_submodule(module)
            if not isinstance(layer, LoraLinear):
                parent, _, child = module.rpartition(".")
                layer = LoraLinear(layer, self.rows)
                self.model.get_submodule(parent).register_module(child, layer)
            layer.adapters[slot] = (a.to(weight.device, weight.dtype).contiguous(),
                                    b.to(weight.device, weight.dtype).contiguous(), adapter.scale)
        self.slots[adapter.name] = slot
        self.by_slot[slot] = adapter
        return slot

    def remove(self, name: str) -> bool:
        """Stop serving adapter ``name``, which no request in flight may use (the caller's check: lanes
        that ran it last are let go); False when it is not served. Only between forwards."""
        slot = self.slots.pop(name, None)
        if slot is None:
            return False
        for lane in [lane for lane, s in self._lane_slot.items() if s == slot]:
            del self._lane_slot[lane]
        del self.by_slot[slot]
        for layer in self.model.modules():
            if isinstance(layer, LoraLinear):
                layer.adapters.pop(slot, None)
        return True

    def slot(self, name: str) -> int | None:
        return self.slots.get(name)

    def identity(self, slot: int) -> str:
        """The adapter in ``slot`` as reuse scopes it: its name and the digest of its files."""
        return self.by_slot[slot].identity

    def assign(self, lane: int, slot: int) -> None:
        """``lane``'s rows take adapter ``slot`` from now on (-1: none)."""
        if slot < 0:
            self._lane_slot.pop(lane, None)
        else:
            self._lane_slot[lane] = slot

    def takes(self, lanes) -> bool:
        """Whether any of ``lanes`` runs an adapter."""
        return bool(self._lane_slot) and any(lane in self._lane_slot for lane in lanes)

    def begin(self, seq_rows, device: torch.device) -> None:
        """Before a forward: the rows of each adapter from ``seq_rows`` ((lane, first row, end row) per
        sequence of the batch), or none."""
        if not self._lane_slot:
            self.rows.groups = None
            return
        ranges: dict[int, list[range]] = {}
        for lane, start, end in seq_rows:
            slot = self._lane_slot.get(lane)
            if slot is not None:
                ranges.setdefault(slot, []).append(range(start, end))
        self.rows.groups = [(slot, torch.tensor([i for r in rs for i in r], dtype=torch.int64, device=device))
                            for slot, rs in ranges.items()] or None
