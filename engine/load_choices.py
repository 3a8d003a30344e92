"""What the engine decides at load from its flags and the machine: the device, the KV format, the KV stamp."""

from __future__ import annotations

import logging

from ignis.engine.config import EngineConfig

log = logging.getLogger("ignis.engine")


def resolve_device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return choice


def resolve_kv_format(config: EngineConfig, device: str, cfg) -> str:
    """--kv-format resolved for the model's load dtype; an explicit hq-e8-2b on heads it cannot store
    raises ValueError."""
    from ignis.engine.models.loader import resolve_dtype
    from ignis.kernels.hq_e8.codec import check_shape

    dtype = resolve_dtype(config.dtype, device, cfg.dtype)
    try:
        check_shape(cfg.num_kv_heads, cfg.head_dim)
        fits = True
    except ValueError as exc:
        if config.kv_format == "hq-e8-2b":
            raise
        fits = False
        if device == "cuda":
            log.warning("kv format: %s; using bf16", exc)
    kv_format = config.resolved_kv_format(device, hq_fits=fits, dtype=dtype)
    if config.kv_format == "auto" and device == "cuda" and fits and kv_format == "bf16":
        log.info("kv format: bf16 pages for a %s model (auto picks hq-e8-2b for bfloat16/float16)", dtype)
    return kv_format


def kv_stamp(kv_format: str, exact_window: int) -> str:
    """The KV part of a retained entry's stamp: the format, and for hq-e8-2b the window its images hold."""
    return f"{kv_format}+w{exact_window}" if kv_format == "hq-e8-2b" else kv_format
