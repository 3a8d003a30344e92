"""What the engine decides at load from its flags and the machine: the device, the KV format, the KV stamp."""

from __future__ import annotations

from ignis.engine.config import EngineConfig


def resolve_device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return choice


def resolve_kv_format(config: EngineConfig, device: str, cfg) -> str:
    """--kv-format resolved; an explicit hq-e8-2b on heads it cannot store raises ValueError."""
    from ignis.kernels.hq_e8.codec import check_shape

    kv_format = config.resolved_kv_format(device)
    if kv_format == "hq-e8-2b":
        check_shape(cfg.num_kv_heads, cfg.head_dim)
    return kv_format


def kv_stamp(kv_format: str, exact_window: int) -> str:
    """The KV part of a retained entry's stamp: the format, and for hq-e8-2b the window its images hold."""
    return f"{kv_format}+w{exact_window}" if kv_format == "hq-e8-2b" else kv_format
