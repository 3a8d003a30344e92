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
    mtp.*                             -> the drafter's tensors (``engine.models.mtp_spec``) when the
                                         set is complete and well shaped; else set aside, with the
                                         reason in ``LoadedCheckpoint.drafter_note``
    X.weight (fp8) + X.weight_scale_inv -> X.weight dequantized into the load dtype (block-wise fp8
                                         checkpoints, ``engine.models.fp8_blocks``)

torch, safetensors and tqdm are imported only when tensors are read, so the
header-level functions serve ``ignis inspect`` without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ignis.engine.models.checkpoint_error import safetensors_file
from ignis.engine.models.config import CheckpointError, ModelConfig, load_config
from ignis.engine.models.fp8_blocks import FP8_DTYPE, SCALE_SUFFIX, dequantize, read_scales, scale_shape
from ignis.engine.models.mtp_spec import classify_mtp, expected_mtp_tensors, mtp_layer_count
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

log = logging.getLogger("ignis.engine")

if TYPE_CHECKING:
    import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}
"""``--dtype`` names, vLLM's among them (``half``, ``float``)."""

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
    # the drafter (mtp.*): read like the target's tensors, kept apart from them
    drafter_direct: dict[str, tuple[Path, str]] = field(default_factory=dict)
    drafter_experts: dict[str, dict[tuple[int, str], tuple[Path, str]]] = field(default_factory=dict)
    drafter_expected: dict[str, tuple[int, ...]] = field(default_factory=dict)
    drafter_layers: int = 0
    drafter_note: str = "the checkpoint has no mtp.* weights"
    # block-wise fp8: weight name -> (file, name) of its weight_scale_inv
    scales: dict[str, tuple[Path, str]] = field(default_factory=dict)

    @property
    def drafter_count(self) -> int:
        return len(self.drafter_direct) + sum(len(p) for p in self.drafter_experts.values())


def plan_load(cfg: ModelConfig, inventory: dict[str, tuple[Path, HeaderEntry]],
              files: WeightFiles) -> LoadPlan:
    """Match file tensors to canonical names; raise naming every unknown, missing or misshapen tensor."""
    expected = expected_tensors(cfg)
    plan = LoadPlan()
    seen: dict[str, str] = {}
    unknown, bad_shape, bad_dtype = [], [], []
    mtp: dict[str, tuple[Path, HeaderEntry]] = {}
    inventory, plan.scales = _split_scales(cfg, inventory, bad_shape, bad_dtype)
    for name, (path, entry) in sorted(inventory.items()):
        nk = classify(name)
        if nk.kind == "mtp":
            mtp[name] = (path, entry)
            continue
        if nk.kind == "vision":
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
        if not _float_or_scaled(name, entry, plan.scales):
            bad_dtype.append(f"{name} (in {path.name}): {entry.dtype}"
                             + (" without its weight_scale_inv" if entry.dtype == FP8_DTYPE else ""))
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
    if mtp:
        _plan_drafter(cfg, mtp, plan)
    return plan


def _split_scales(cfg: ModelConfig, inventory: dict[str, tuple[Path, HeaderEntry]], bad_shape: list[str],
                  bad_dtype: list[str]) -> tuple[dict, dict[str, tuple[Path, str]]]:
    """The inventory without the fp8 scales, and weight name -> its scale (``engine.models.fp8_blocks``);
    a scale whose weight is missing, not fp8 or not 2-D, or whose grid does not fit it, is reported."""
    rest = {n: v for n, v in inventory.items() if not n.endswith(SCALE_SUFFIX)}
    scales: dict[str, tuple[Path, str]] = {}
    for name, (path, entry) in sorted(inventory.items()):
        if not name.endswith(SCALE_SUFFIX):
            continue
        if cfg.fp8_block is None:
            raise CheckpointError(f"{name} (in {path.name}) is an fp8 scale, but config.json names no block-wise "
                                  "fp8 quantization_config")
        weight = name[:-len(SCALE_SUFFIX)] + ".weight"
        held = rest.get(weight)
        if held is None:
            raise CheckpointError(f"unexpected tensors: {name} (in {path.name}) scales {weight}, which is missing")
        w = held[1]
        if w.dtype != FP8_DTYPE or len(w.shape) != 2:
            bad_dtype.append(f"{name} (in {path.name}) scales {weight}, a {w.dtype} {list(w.shape)} tensor, "
                             f"not a 2-D {FP8_DTYPE} one")
            continue
        want = scale_shape(w.shape, cfg.fp8_block)
        if entry.shape != want or entry.dtype not in FLOAT_DTYPES:
            bad_shape.append(f"{name} (in {path.name}): got {entry.dtype} {list(entry.shape)}, expected a float "
                             f"{list(want)} grid of {cfg.fp8_block[0]}x{cfg.fp8_block[1]} blocks")
            continue
        scales[weight] = (path, name)
    return rest, scales


def _float_or_scaled(name: str, entry: HeaderEntry, scales: dict) -> bool:
    """A float tensor, or an fp8 one with its block scales."""
    return entry.dtype in FLOAT_DTYPES or (entry.dtype == FP8_DTYPE and name in scales)


def _plan_drafter(cfg: ModelConfig, mtp: dict[str, tuple[Path, HeaderEntry]], plan: LoadPlan) -> None:
    """Take the mtp.* tensors as the drafter when they make a whole head; else set them aside, saying why.

    A checkpoint with a partial or misshapen head still serves its target model."""
    layers = mtp_layer_count(cfg, mtp)
    expected = expected_mtp_tensors(cfg, layers)
    direct: dict[str, tuple[Path, str]] = {}
    experts: dict[str, dict[tuple[int, str], tuple[Path, str]]] = {}
    problems = []
    for name, (path, entry) in sorted(mtp.items()):
        nk = classify_mtp(name)
        if nk.canonical not in expected or (nk.kind == "expert" and nk.expert >= cfg.num_experts):
            problems.append(f"unexpected {name}")
            continue
        want = expert_part_shape(cfg, nk.part) if nk.kind == "expert" else expected[nk.canonical]
        if entry.shape != tuple(want) or not _float_or_scaled(name, entry, plan.scales):
            problems.append(f"{name}: {entry.dtype} {list(entry.shape)}, expected {list(want)}")
        elif nk.kind == "expert":
            experts.setdefault(nk.canonical, {})[(nk.expert, nk.part)] = (path, name)
        else:
            direct[nk.canonical] = (path, name)
    for canonical in expected:
        if canonical in direct:
            continue
        pieces = experts.get(canonical)
        if pieces is None:
            problems.append(f"missing {canonical}")
            continue
        parts = ("down_proj",) if canonical.endswith("down_proj") else ("gate_proj", "up_proj")
        if len(pieces) != cfg.num_experts * len(parts):
            problems.append(f"missing experts of {canonical}")
    if layers == 0:
        problems.insert(0, "no mtp.layers.N decoder layer")
    if problems:
        plan.set_aside["mtp"] = sorted(mtp)
        plan.drafter_note = f"the mtp.* weights do not make a whole drafter ({_names(problems)})"
        return
    plan.drafter_direct, plan.drafter_experts, plan.drafter_expected = direct, experts, expected
    plan.drafter_layers = layers
    plan.drafter_note = f"a drafter of {layers} multi-token-prediction layer(s)"


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
        raise ValueError(f"--dtype: unknown dtype {dtype!r} (float32, bfloat16, float16, fp32, bf16, fp16, half, "
                         f"float, auto)")
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
    if fields.get("yarn") is None:
        fields.pop("yarn", None)  # plain rope hashes as it did before YaRN was read
    else:
        fields["yarn"] = dataclasses.asdict(fields["yarn"])
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
    # the multi-token-prediction head: its layer count when the checkpoint holds a whole one (else 0),
    # what was found, and its tensors (canonical ``mtp.*`` names) when they were asked for
    drafter_layers: int = 0
    drafter_note: str = "the checkpoint has no mtp.* weights"
    drafter_tensors: dict[str, "torch.Tensor"] = field(default_factory=dict)

    @property
    def has_drafter(self) -> bool:
        """The checkpoint holds a whole multi-token-prediction head (loaded or not)."""
        return self.drafter_layers > 0
    vision: VisionConfig | None = None
    """The vision tower's config when its weights were loaded (None: text only)."""
    vision_tensors: dict[str, "torch.Tensor"] = field(default_factory=dict)


def load_checkpoint(model_dir: str | Path, dtype: str | None = None, device: str = "cpu",
                    progress: bool | None = None, drafter: bool = True, vision: bool = True) -> LoadedCheckpoint:
    """Read, check and convert a checkpoint; see the module docstring for the layouts.

    ``drafter``: read the multi-token-prediction head's tensors too (when the checkpoint has a
    whole one); without it the head is checked from the headers and left on disk. ``vision``: read a
    multimodal checkpoint's vision tower (off: the language model alone, its tower left on disk)."""
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
    if plan.ignored:
        log.warning("config.json ties the LM head to the embeddings (tie_word_embeddings): the checkpoint's own "
                    "%s is not used, as vLLM does not use it (set tie_word_embeddings to false to serve it)",
                    ", ".join(plan.ignored))
    tensors = _read_tensors(cfg, plan.direct, plan.experts, expected_tensors(cfg),
                            getattr(torch, dtype_name), dev, progress, "weights", plan.scales)
    head = {}
    if drafter and plan.drafter_count:
        head = _read_tensors(cfg, plan.drafter_direct, plan.drafter_experts, plan.drafter_expected,
                             getattr(torch, dtype_name), dev, progress, "drafter weights", plan.scales)
    meta = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()}
    vcfg = load_vision_config(model_dir) if vision and plan.set_aside.get("vision") else None
    vision_tensors, vision_stamp = {}, None
    if vcfg is not None:
        vision_tensors = read_vision_tensors(vcfg, plan.set_aside["vision"], read_inventory(files),
                                             getattr(torch, dtype_name), dev, plan.scales, cfg.fp8_block)
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
        drafter_layers=plan.drafter_layers,
        drafter_note=plan.drafter_note,
        drafter_tensors=head,
        vision=vcfg,
        vision_tensors=vision_tensors,
    )


def _read_tensors(cfg: ModelConfig, direct: dict, experts: dict, expected: dict, dtype: "torch.dtype",
                  device: "torch.device", progress: bool | None, what: str,
                  scales: dict | None = None) -> dict[str, "torch.Tensor"]:
    """Read ``direct`` tensors and stack ``experts`` pieces; -> every name of ``expected``. A tensor named
    in ``scales`` is block-wise fp8: dequantized (on ``device``) before it takes the load dtype."""
    import torch
    from tqdm import tqdm

    wanted = {name for _, name in direct.values()}
    wanted |= {name for pieces in experts.values() for _, name in pieces.values()}
    scale_of = read_scales({n: where for n, where in (scales or {}).items() if n in wanted})

    by_file: dict[Path, list[tuple[str, str, int, str]]] = {}
    for canonical, (path, name) in direct.items():
        by_file.setdefault(path, []).append((canonical, name, -1, ""))
    for canonical, pieces in experts.items():
        for (e, part), (path, name) in pieces.items():
            by_file.setdefault(path, []).append((canonical, name, e, part))

    out: dict[str, torch.Tensor] = {}
    inter = cfg.moe_intermediate_size
    show = sys.stderr.isatty() if progress is None else progress
    total = len(direct) + sum(len(p) for p in experts.values())
    with tqdm(total=total, desc=f"loading {what}", unit="tensor",
              disable=not show, file=sys.stderr) as bar:
        for path in sorted(by_file):
            with safetensors_file(path) as f:
                for canonical, name, e, part in by_file[path]:
                    t = f.get_tensor(name)
                    if name in scale_of:
                        t = dequantize(t.to(device), scale_of[name], cfg.fp8_block)
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
    return {name: out[name] for name in expected}

