"""The one backend switch: which implementation of each op the model calls.

``select_ops("cpu")`` gives the torch twins (the reference backend CI runs);
``select_ops("cuda")`` gives the Triton kernels where a Triton form of the op
exists. Every call site in the model goes through an ``Ops`` record, so no
layer carries its own device conditionals. The record holds the ops of both
KV formats: ``write_kv`` / ``*_attention`` for bf16 pages and ``hq_*`` for
hq-e8-2b pages plus the exact window; the attention layer calls the set its
pool's format names. ``IGNIS_KERNELS=reference|triton``
overrides the choice (tests use it to run Triton forms under
``TRITON_INTERPRET=1`` on the CPU).

The record says which path it is (``Ops.name``): "triton" (every op on its
Triton form), "reference" (every op on its twin) or "mixed"; ``Ops.fallbacks``
names each op whose Triton form failed to import, with the import error, and
that runs on its twin instead. ``require_kernel_path`` is the engine's check
at load: on CUDA a fallback (Triton itself missing included) refuses to start
unless the engine was told ``--allow-torch-fallback``. ``IGNIS_KERNELS=reference``
on CUDA is an explicit choice of the twins, not a fallback: it is allowed and
reports path "reference".
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import Callable

from ignis.kernels.causal_conv import reference as conv_ref
from ignis.kernels.fused import reference as fused_ref
from ignis.kernels.gated_delta_rule import reference as gdr_ref
from ignis.kernels.hq_e8 import reference as hq_ref
from ignis.kernels.paged_attention import reference as attn_ref

log = logging.getLogger("ignis.kernels")


@dataclass(frozen=True)
class Ops:
    """The ops the hybrid model calls; signatures as in each op's reference.py.

    ``name`` is the path: "triton", "reference" or "mixed". ``fallbacks``:
    one "op: error" per op whose Triton form failed to import (it runs its twin).
    """

    name: str
    write_kv: Callable
    prefill_attention: Callable
    decode_attention: Callable
    chunk_gated_delta_rule: Callable
    recurrent_gated_delta_rule: Callable
    causal_conv1d_varlen: Callable
    causal_conv1d_update: Callable
    hq_write_kv: Callable
    hq_window_write: Callable
    hq_prefill_attention: Callable
    hq_decode_attention: Callable
    rms_norm: Callable
    add_rms_norm: Callable
    gated_rms_norm: Callable
    norm_rotary: Callable
    silu_mul: Callable
    sigmoid_mul: Callable
    gdn_gating: Callable
    fallbacks: tuple[str, ...] = ()


REFERENCE = Ops(
    name="reference",
    write_kv=attn_ref.write_kv,
    prefill_attention=attn_ref.prefill_attention,
    decode_attention=attn_ref.decode_attention,
    chunk_gated_delta_rule=gdr_ref.chunk_gated_delta_rule,
    recurrent_gated_delta_rule=gdr_ref.recurrent_gated_delta_rule,
    causal_conv1d_varlen=conv_ref.causal_conv1d_varlen,
    causal_conv1d_update=conv_ref.causal_conv1d_update,
    hq_write_kv=hq_ref.write_kv,
    hq_window_write=hq_ref.window_write,
    hq_prefill_attention=hq_ref.prefill_attention,
    hq_decode_attention=hq_ref.decode_attention,
    rms_norm=fused_ref.rms_norm,
    add_rms_norm=fused_ref.add_rms_norm,
    gated_rms_norm=fused_ref.gated_rms_norm,
    norm_rotary=fused_ref.norm_rotary,
    silu_mul=fused_ref.silu_mul,
    sigmoid_mul=fused_ref.sigmoid_mul,
    gdn_gating=fused_ref.gdn_gating,
)

# op name -> "module:function" of its Triton form
TRITON_FORMS = {
    "write_kv": "ignis.kernels.paged_attention.triton_write:write_kv",
    "prefill_attention": "ignis.kernels.paged_attention.triton_prefill:prefill_attention",
    "decode_attention": "ignis.kernels.paged_attention.triton_decode:decode_attention",
    "chunk_gated_delta_rule": "ignis.kernels.gated_delta_rule.triton_chunk:chunk_gated_delta_rule",
    "recurrent_gated_delta_rule": "ignis.kernels.gated_delta_rule.triton_recurrent:recurrent_gated_delta_rule",
    "causal_conv1d_varlen": "ignis.kernels.causal_conv.triton_conv:causal_conv1d_varlen",
    "causal_conv1d_update": "ignis.kernels.causal_conv.triton_conv:causal_conv1d_update",
    "hq_write_kv": "ignis.kernels.hq_e8.triton_write:write_kv",
    "hq_window_write": "ignis.kernels.hq_e8.triton_write:window_write",
    "hq_prefill_attention": "ignis.kernels.hq_e8.triton_prefill:prefill_attention",
    "hq_decode_attention": "ignis.kernels.hq_e8.triton_decode:decode_attention",
    "rms_norm": "ignis.kernels.fused.triton_norms:rms_norm",
    "add_rms_norm": "ignis.kernels.fused.triton_norms:add_rms_norm",
    "gated_rms_norm": "ignis.kernels.fused.triton_norms:gated_rms_norm",
    "norm_rotary": "ignis.kernels.fused.triton_norms:norm_rotary",
    "silu_mul": "ignis.kernels.fused.triton_pointwise:silu_mul",
    "sigmoid_mul": "ignis.kernels.fused.triton_pointwise:sigmoid_mul",
    "gdn_gating": "ignis.kernels.fused.triton_pointwise:gdn_gating",
}


def _load(path: str) -> tuple[Callable | None, str]:
    """(the Triton form, "") or (None, why it cannot be had)."""
    module_name, fn = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    form = getattr(module, fn, None)
    return (form, "") if form is not None else (None, f"{module_name} has no {fn}")


def path_name(triton_ops: int) -> str:
    """The path of a record with ``triton_ops`` of its ops on Triton forms."""
    if triton_ops == 0:
        return "reference"
    return "triton" if triton_ops == len(TRITON_FORMS) else "mixed"


def triton_ops() -> Ops:
    """Triton forms where they import; an op whose form does not keeps its twin and is named in ``fallbacks``."""
    fields, fallbacks = {}, []
    for op, path in TRITON_FORMS.items():
        form, error = _load(path)
        if form is None:
            fallbacks.append(f"{op}: {error}")
            form = getattr(REFERENCE, op)
        fields[op] = form
    return Ops(name=path_name(len(TRITON_FORMS) - len(fallbacks)), fallbacks=tuple(fallbacks), **fields)


def select_ops(device_type: str) -> Ops:
    """The ops for a device type ("cpu" or "cuda"), honouring IGNIS_KERNELS."""
    choice = os.environ.get("IGNIS_KERNELS", "").strip().lower()
    if choice not in ("", "reference", "triton"):
        raise ValueError(f"IGNIS_KERNELS: expected 'reference' or 'triton', got {choice!r}")
    if choice == "reference":
        return REFERENCE
    if choice == "triton" or device_type == "cuda":
        return triton_ops()
    return REFERENCE


class KernelPathError(RuntimeError):
    """On CUDA, an op would run on its torch twin because its Triton form failed to import."""


def require_kernel_path(ops: Ops, device_type: str, allow_fallback: bool) -> None:
    """Refuse (``KernelPathError``) a CUDA load where ``ops`` has fallbacks, unless ``allow_fallback``
    (then a WARNING names them). On the CPU, and for the twins chosen by IGNIS_KERNELS=reference,
    nothing is refused."""
    if device_type != "cuda" or not ops.fallbacks:
        log.info("kernel path: %s", ops.name)
        return
    by_error: dict[str, list[str]] = {}
    for entry in ops.fallbacks:
        op, _, error = entry.partition(": ")
        by_error.setdefault(error, []).append(op)
    detail = "; ".join(f"{', '.join(names)} ({error})" for error, names in by_error.items())
    what = (f"kernel path {ops.name}: {len(ops.fallbacks)} of {len(TRITON_FORMS)} ops run on their torch twins "
            f"because their Triton forms failed to import: {detail}")
    if not allow_fallback:
        raise KernelPathError(f"{what}. Fix the Triton install, or pass --allow-torch-fallback to serve on the "
                              "twins (much slower)")
    log.warning("%s; serving on the twins (--allow-torch-fallback)", what)


def kernel_info(ops: Ops) -> dict[str, int]:
    """The path as Stats numbers: ops on Triton forms, ops on twins, and of those the fallbacks."""
    on_triton = sum(getattr(ops, op) is not getattr(REFERENCE, op) for op in TRITON_FORMS)
    return {"kernel_triton_ops": on_triton, "kernel_twin_ops": len(TRITON_FORMS) - on_triton,
            "kernel_fallback_ops": len(ops.fallbacks)}
