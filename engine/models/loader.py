"""Loading a Hugging Face style checkpoint directory into canonical tensors.

Owns the checkpoint on disk: finding its weight files (``model.safetensors``,
or ``model.safetensors.index.json`` and its shards), checking every tensor name
and shape against ``expected_tensors`` from the headers alone before any tensor
is read, then reading tensors one at a time, converting them to the load dtype
and stacking per-expert MoE weights. The tokenizer files are read by
``shared.tokenizer_files``, not here.

Checkpoint names map to canonical names (see ``engine.models.weights_spec``):

    model.layers.N.*                  -> layers.N.*      (text-only layout)
    model.language_model.layers.N.*   -> layers.N.*      (Qwen3_5ForConditionalGeneration)
    lm_head.weight                    -> lm_head.weight  (ignored when embeddings are tied)
    ...mlp.experts.E.{gate,up}_proj.weight -> mlp.experts.gate_up_proj[E, :I | I:]
    ...mlp.experts.E.down_proj.weight      -> mlp.experts.down_proj[E]
    model.visual.*, visual.*          -> the vision tower's tensors (``vision_tensors``, names
                                         without the prefix), read when config.json has a
                                         vision_config and the files hold the tower
    mtp.*                             -> set aside, not loaded

torch, safetensors and tqdm are imported only when tensors are read, so the
header-level functions serve ``ignis inspect`` without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ignis.engine.models.config import CheckpointError, ModelConfig, load_config
from ignis.engine.models.vision_config import VisionConfig, load_vision_config
from ignis.engine.models.vision_load import read_vision_tensors, vision_structure
from ignis.engine.models.weights_spec import (
    FLOAT_DTYPES,
    HeaderEntry,
    classify,
    expected_tensors,
    expert_part_shape,
    keeps_float32,
    read_header,
)

if TYPE_CHECKING:
    import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16",
}

_SHOW = 8  # names listed in one error before "... and N more"


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOW])
    return shown + (f", ... and {len(items) - _SHOW} more" if len(items) > _SHOW else "")


# ----- weight files ----------------------------------------------------------
@dataclass(frozen=True)
class WeightFiles:
    """The weight files of a checkpoint and, when sharded, its index."""

    files: tuple[Path, ...]
    index: Path | None = None
    index_map: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """Where a tensor is expected, for error messages."""
        if self.index is not None:
            return f"one of the shards listed by {self.index}"
        return ", ".join(str(f) for f in self.files)


def find_weight_files(model_dir: str | Path) -> WeightFiles | None:
    """The checkpoint's weight files, or None when the directory holds no weights."""
    model_dir = Path(model_dir)
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return WeightFiles((single,))
    index = model_dir / INDEX_FILE
    if index.is_file():
        return _read_index(index)
    others = sorted(model_dir.glob("*.safetensors"))
    return WeightFiles(tuple(others)) if others else None


def _read_index(index: Path) -> WeightFiles:
    try:
        raw = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index}: not valid JSON ({exc})") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: no 'weight_map' object of tensor name -> shard file")
    shards = []
    for shard in dict.fromkeys(weight_map.values()):
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise CheckpointError(f"{index}: shard path {shard!r} leaves the model directory")
        path = index.parent / shard
        if not path.is_file():
            raise CheckpointError(f"{path}: shard listed in {index} is missing")
        shards.append(path)
    return WeightFiles(tuple(shards), index, dict(weight_map))


def read_inventory(files: WeightFiles) -> dict[str, tuple[Path, HeaderEntry]]:
    """Every tensor name in the files -> (file, header entry), from headers only."""
    out: dict[str, tuple[Path, HeaderEntry]] = {}
    for path in files.files:
        for name, entry in read_header(path).items():
            if name in out:
                raise CheckpointError(f"tensor {name} appears in both {out[name][0]} and {path}")
            out[name] = (path, entry)
    for name, shard in files.index_map.items():
        where = out.get(name)
        if where is None or where[0].name != Path(shard).name:
            raise CheckpointError(
                f"{files.index.parent / shard}: tensor {name} listed in {files.index} is not in this shard")
    return out


# ----- load plan -------------------------------------------------------------
@dataclass
class LoadPlan:
    """What to read from where: checked against the config, nothing read yet."""

    direct: dict[str, tuple[Path, str]] = field(default_factory=dict)
    # stacked canonical name -> {(expert, part): (file, name)}
    experts: dict[str, dict[tuple[int, str], tuple[Path, str]]] = field(default_factory=dict)
    set_aside: dict[str, list[str]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    @property
    def tensor_count(self) -> int:
        return len(self.direct) + sum(len(p) for p in self.experts.values())


def plan_load(cfg: ModelConfig, inventory: dict[str, tuple[Path, HeaderEntry]],
              files: WeightFiles) -> LoadPlan:
    """Match file tensors to canonical names; raise naming every unknown, missing or misshapen tensor."""
    expected = expected_tensors(cfg)
    plan = LoadPlan()
    seen: dict[str, str] = {}
    unknown, bad_shape, bad_dtype = [], [], []
    for name, (path, entry) in sorted(inventory.items()):
        nk = classify(name)
        if nk.kind in ("vision", "mtp"):
            plan.set_aside.setdefault(nk.kind, []).append(name)
            continue
        if nk.canonical == "lm_head.weight" and cfg.tie_word_embeddings:
            plan.ignored.append(name)
            continue
        if nk.canonical not in expected or (nk.kind == "expert" and nk.expert >= cfg.num_experts):
            unknown.append(f"{name} (in {path.name})")
            continue
        key = f"{nk.canonical}[{nk.expert}].{nk.part}" if nk.kind == "expert" else nk.canonical
        earlier = seen.get(key)
        if earlier is None and nk.kind == "tensor" and nk.canonical in plan.experts:
            earlier = "per-expert weights"
        if earlier is None and nk.kind == "expert" and nk.canonical in plan.direct:
            earlier = plan.direct[nk.canonical][1]
        if earlier is not None:
            raise CheckpointError(f"tensor {nk.canonical} is given twice: as {earlier} and as {name}")
        seen[key] = name
        want = expert_part_shape(cfg, nk.part) if nk.kind == "expert" else expected[nk.canonical]
        if entry.shape != tuple(want):
            bad_shape.append(f"{name} (in {path.name}): got {list(entry.shape)}, expected {list(want)}")
        if entry.dtype not in FLOAT_DTYPES:
            bad_dtype.append(f"{name} (in {path.name}): {entry.dtype}")
        if nk.kind == "expert":
            plan.experts.setdefault(nk.canonical, {})[(nk.expert, nk.part)] = (path, name)
        else:
            plan.direct[nk.canonical] = (path, name)
    if unknown:
        raise CheckpointError(f"unexpected tensors, not part of a {cfg.architecture}: {_names(unknown)}")
    missing = _missing(cfg, expected, plan, files)
    if missing:
        raise CheckpointError(f"missing tensors: {_names(missing)}")
    if bad_shape:
        raise CheckpointError(f"unexpected shape: {_names(bad_shape)}")
    if bad_dtype:
        raise CheckpointError(f"tensors with a non-floating-point dtype: {_names(bad_dtype)}")
    return plan


def _missing(cfg: ModelConfig, expected: dict, plan: LoadPlan, files: WeightFiles) -> list[str]:
    prefix = "model.language_model." if cfg.multimodal else "model."
    where = files.describe()
    out = []
    for canonical in expected:
        if canonical in plan.direct:
            continue
        pieces = plan.experts.get(canonical)
        if pieces is None:
            as_name = canonical if canonical.startswith("lm_head.") else prefix + canonical
            out.append(f"{canonical} (expected as {as_name} in {where})")
            continue
        parts = ("down_proj",) if canonical.endswith("down_proj") else ("gate_proj", "up_proj")
        base = prefix + canonical.rsplit(".", 1)[0]
        for e in range(cfg.num_experts):
            for part in parts:
                if (e, part) not in pieces:
                    out.append(f"{base}.{e}.{part}.weight (expert {e} of {canonical}, expected in {where})")
    return out


# ----- dtype -----------------------------------------------------------------
def resolve_dtype(dtype: str | None, device: str, checkpoint_dtype: str) -> str:
    """The load dtype: None/'auto' -> the checkpoint's on CPU, bfloat16 on CUDA."""
    key = None if dtype is None else str(dtype).strip().lower()
    if key is None or key == "auto":
        return "bfloat16" if str(device).startswith("cuda") else checkpoint_dtype
    name = DTYPE_ALIASES.get(key)
    if name is None:
        raise ValueError(f"--dtype: unknown dtype {dtype!r} (float32, bfloat16, float16, fp32, bf16, fp16, auto)")
    return name


# ----- structural hash -------------------------------------------------------
def structural_hash(cfg: ModelConfig, tensors: dict[str, tuple[tuple[int, ...], str]],
                    vision: dict | None = None) -> str:
    """sha256 over the config's structural fields and sorted (name, shape, dtype) of the tensors.

    It identifies the model's structure and load dtype, not its weight values.
    ``vision`` (a loaded vision tower: its config fields, tensor table and a
    digest of its weight values) joins the payload only when given, so a
    text-only load hashes as it always did.
    """
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.compare}
    table = [[name, list(shape), dtype] for name, (shape, dtype) in sorted(tensors.items())]
    body = {"config": fields, "tensors": table}
    if vision is not None:
        body["vision"] = vision
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


# ----- loading ---------------------------------------------------------------
@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint's config and its text-model tensors under canonical names."""

    config: ModelConfig
    tensors: dict[str, "torch.Tensor"]
    set_aside: dict[str, list[str]]
    dtype: str
    weight_bytes: int
    structural_hash: str
    model_dir: Path
    device: str
    vision: VisionConfig | None = None
    """The vision tower's config when its weights were loaded (None: text only)."""
    vision_tensors: dict[str, "torch.Tensor"] = field(default_factory=dict)


def load_checkpoint(model_dir: str | Path, dtype: str | None = None, device: str = "cpu",
                    progress: bool | None = None) -> LoadedCheckpoint:
    """Read, check and convert a checkpoint; see the module docstring for the layouts."""
    import torch

    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {device!r} asked for, but CUDA is not available")
    dtype_name = resolve_dtype(dtype, dev.type, cfg.dtype)
    files = find_weight_files(model_dir)
    if files is None:
        raise CheckpointError(f"{model_dir}: no weights ({SINGLE_FILE} or {INDEX_FILE})")
    plan = plan_load(cfg, read_inventory(files), files)
    tensors = _read_tensors(cfg, plan, getattr(torch, dtype_name), dev, progress)
    meta = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()}
    vcfg = load_vision_config(model_dir) if plan.set_aside.get("vision") else None
    vision_tensors, vision_stamp = {}, None
    if vcfg is not None:
        vision_tensors = read_vision_tensors(vcfg, plan.set_aside["vision"], read_inventory(files),
                                             getattr(torch, dtype_name), dev)
        vision_stamp = vision_structure(vcfg, vision_tensors)
    return LoadedCheckpoint(
        config=cfg,
        tensors=tensors,
        set_aside={k: sorted(v) for k, v in plan.set_aside.items()},
        dtype=dtype_name,
        weight_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        structural_hash=structural_hash(cfg, meta, vision_stamp),
        model_dir=model_dir,
        device=str(dev),
        vision=vcfg,
        vision_tensors=vision_tensors,
    )


def _read_tensors(cfg: ModelConfig, plan: LoadPlan, dtype: "torch.dtype", device: "torch.device",
                  progress: bool | None) -> dict[str, "torch.Tensor"]:
    import torch
    from safetensors import SafetensorError, safe_open
    from tqdm import tqdm

    expected = expected_tensors(cfg)
    by_file: dict[Path, list[tuple[str, str, int, str]]] = {}
    for canonical, (path, name) in plan.direct.items():
        by_file.setdefault(path, []).append((canonical, name, -1, ""))
    for canonical, pieces in plan.experts.items():
        for (e, part), (path, name) in pieces.items():
            by_file.setdefault(path, []).append((canonical, name, e, part))

    out: dict[str, torch.Tensor] = {}
    inter = cfg.moe_intermediate_size
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=plan.tensor_count, desc="loading weights", unit="tensor",
              disable=not show, file=sys.stderr) as bar:
        for path in sorted(by_file):
            try:
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    for canonical, name, e, part in by_file[path]:
                        t = f.get_tensor(name)
                        target = torch.float32 if keeps_float32(canonical) else dtype
                        if e < 0:
                            out[canonical] = t.to(device=device, dtype=target).contiguous()
                        else:
                            if canonical not in out:
                                out[canonical] = torch.empty(expected[canonical], dtype=target, device=device)
                            dst = out[canonical][e]
                            if part == "gate_proj":
                                dst = dst[:inter]
                            elif part == "up_proj":
                                dst = dst[inter:]
                            dst.copy_(t)
                        bar.update(1)
            except SafetensorError as exc:
                raise CheckpointError(f"{path}: corrupt safetensors file ({exc})") from None
            except OSError as exc:
                raise CheckpointError(f"{path}: cannot read ({exc})") from None
    return {name: out[name] for name in expected}
