"""Triton form of ``write_kv``: scatter new tokens' keys and values into their pool slots.

One program per new token copies its ``Hkv * D`` keys and values to
``slot_mapping[t]``; the pool layout is the twin's (``reference.py``)::

    k_cache, v_cache : [num_pages, PAGE, Hkv, D]      slot = page * PAGE + row
    key, value       : [T, Hkv, D]                    any strides
    slot_mapping     : [T] int                        a negative slot is skipped

Pool offsets are computed in int64 (a pool can exceed 2**31 elements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    k_cache, v_cache, key, value, slot_mapping,
    s_kc_p, s_kc_r, s_kc_h, s_kc_d,
    s_vc_p, s_vc_r, s_vc_h, s_vc_d,
    s_k_t, s_k_h, s_k_d,
    s_v_t, s_v_h, s_v_d,
    H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BH: tl.constexpr, BD: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    if slot >= 0:
        page = slot // PAGE
        row = slot % PAGE
        o_h = tl.arange(0, BH)[:, None]
        o_d = tl.arange(0, BD)[None, :]
        mask = (o_h < H) & (o_d < D)
        b_k = tl.load(key + t * s_k_t + o_h * s_k_h + o_d * s_k_d, mask=mask)
        b_v = tl.load(value + t * s_v_t + o_h * s_v_h + o_d * s_v_d, mask=mask)
        p_kc = k_cache + page * s_kc_p + row * s_kc_r + o_h * s_kc_h + o_d * s_kc_d
        p_vc = v_cache + page * s_vc_p + row * s_vc_r + o_h * s_vc_h + o_d * s_vc_d
        tl.store(p_kc, b_k.to(k_cache.dtype.element_ty), mask=mask)
        tl.store(p_vc, b_v.to(v_cache.dtype.element_ty), mask=mask)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` [T, Hkv, D] into their slots of the pool, in place."""
    total, hkv, d = key.shape
    if total == 0:
        return
    page = k_cache.shape[1]
    _write_kv_kernel[(total,)](
        k_cache, v_cache, key, value, slot_mapping,
        *k_cache.stride(), *v_cache.stride(), *key.stride(), *value.stride(),
        H=hkv, D=d, PAGE=page,
        BH=triton.next_power_of_2(hkv), BD=triton.next_power_of_2(d),
        num_warps=4,
    )
