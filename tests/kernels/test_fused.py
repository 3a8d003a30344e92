"""Triton fused norms and gates against their torch twins (kernels/fused).

Inputs are non-contiguous views where the model passes views (q heads sliced
out of the q|gate projection, the attention gate, the SwiGLU halves);
shapes include a non-power-of-two width (masking) and the 27B's widths.
Tolerances (relative RMS): fp32 1e-5 (measured ~1e-7; softplus ~3e-7); bf16 1e-2
(measured ~4e-3: the twins round intermediates to bf16, the kernels round once;
under the interpreter a cast to bf16 truncates). The new residual of
``add_rms_norm`` is bitwise the twin's on a GPU and in fp32.
"""

from __future__ import annotations

import pytest
import torch

from ignis.kernels.fused import reference as ref
from ignis.kernels.fused import triton_norms, triton_pointwise
from tests.kernels.conftest import DEVICE, assert_close, strided

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6


def rand(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 96), (5, 2, 72), (1, 5120)])
def test_rms_norm(device, gen, dtype, shape):
    x = strided(shape, dtype, device, gen, scale=3.0)
    w = rand(shape[-1:], dtype, device, gen, 0.2)
    got = triton_norms.rms_norm(x, w, EPS)
    assert got.dtype == dtype
    assert_close(got, ref.rms_norm(x, w, EPS), TOL[dtype], f"rms_norm {shape} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 96), (2, 5120)])
def test_add_rms_norm(device, gen, dtype, shape):
    x = rand(shape, dtype, device, gen)
    residual = strided(shape, dtype, device, gen, scale=4.0)
    w = rand(shape[-1:], dtype, device, gen, 0.2)
    want_res, want = ref.add_rms_norm(x, residual, w, EPS)
    got_res, got = triton_norms.add_rms_norm(x, residual, w, EPS)
    what = f"add_rms_norm {shape} {dtype}"
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(got_res, want_res), what + ": the new residual is not the rounded sum"
    else:  # Triton's interpreter casts fp32 to bf16 by truncation, not to nearest
        assert_close(got_res, want_res, TOL[dtype], what + " residual")
    assert_close(got, want, TOL[dtype], what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4, 16), (2, 48, 128), (5, 3, 40)])
def test_gated_rms_norm(device, gen, dtype, shape):
    x = rand(shape, dtype, device, gen, 2.0)
    gate = strided(shape, dtype, device, gen, 2.0)
    w = rand(shape[-1:], dtype, device, gen) + 1.0
    got = triton_norms.gated_rms_norm(x, gate, w, EPS)
    assert_close(got, ref.gated_rms_norm(x, gate, w, EPS), TOL[dtype], f"gated_rms_norm {shape} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,d,r", [(3, 4, 16, 4), (2, 24, 256, 64), (4, 2, 40, 40), (1, 3, 24, 8)])
def test_norm_rotary(device, gen, dtype, t, h, d, r):
    # q heads as the model slices them out of the q|gate projection: [T, H, 2D][..., :D]
    qg = rand((t, h, 2 * d), dtype, device, gen, 2.0)
    x = qg[..., :d]
    w = rand((d,), dtype, device, gen, 0.2)
    angles = torch.rand((t, r // 2), generator=gen) * 50.0
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)
    got = triton_norms.norm_rotary(x, w, cos, sin, EPS)
    assert got.is_contiguous()
    assert_close(got, ref.norm_rotary(x, w, cos, sin, EPS), TOL[dtype], f"norm_rotary T={t} H={h} D={d} R={r} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 96), (2, 3000), (1, 17408)])
def test_silu_mul(device, gen, dtype, shape):
    gate = strided(shape, dtype, device, gen, 3.0)
    up = rand(shape, dtype, device, gen)
    assert_close(triton_pointwise.silu_mul(gate, up), ref.silu_mul(gate, up), TOL[dtype],
                 f"silu_mul {shape} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,d", [(3, 4, 16), (2, 24, 256), (5, 3, 40)])
def test_sigmoid_mul(device, gen, dtype, t, h, d):
    x = rand((t, h, d), dtype, device, gen)
    gate = rand((t, h, 2 * d), dtype, device, gen, 3.0)[..., d:]  # the gate half of q|gate
    assert_close(triton_pointwise.sigmoid_mul(x, gate), ref.sigmoid_mul(x, gate), TOL[dtype],
                 f"sigmoid_mul T={t} H={h} D={d} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,hv", [(1, 4), (4, 48), (7, 40)])
def test_gdn_gating(device, gen, dtype, t, hv):
    a = strided((t, hv), dtype, device, gen, 4.0)
    b = rand((t, hv), dtype, device, gen, 3.0)
    A_log = rand((hv,), dtype, device, gen)
    dt_bias = rand((hv,), dtype, device, gen)
    a[0, 0] = 30.0  # softplus's linear branch
    want_g, want_beta = ref.gdn_gating(a, b, A_log, dt_bias)
    got_g, got_beta = triton_pointwise.gdn_gating(a, b, A_log, dt_bias)
    assert got_g.dtype == torch.float32 and got_beta.dtype == dtype
    assert_close(got_g, want_g, TOL[torch.float32], f"gdn_gating g T={t} Hv={hv} {dtype}")
    assert_close(got_beta, want_beta, TOL[dtype], f"gdn_gating beta T={t} Hv={hv} {dtype}")


def test_gdn_gating_keeps_its_digits_for_very_negative_inputs(device):
    """softplus(x) for x far below 0 is about e^x: log(1 + e^x) rounds it away (g 0 below -20)."""
    x = torch.tensor([[-30.0, -20.5, -16.0, -11.5, -9.0, -2.0, 0.0, 5.0, 19.9, 20.5]], device=device)
    zeros = torch.zeros(x.shape[1], device=device)
    want_g, _ = ref.gdn_gating(x, x, zeros, zeros)
    got_g, _ = triton_pointwise.gdn_gating(x, x, zeros, zeros)
    rel = ((got_g - want_g).abs() / want_g.abs()).max().item()
    assert rel < 1e-5, (got_g, want_g)


def test_shape_mismatch_raises(device):
    x = torch.zeros((2, 8), device=device)
    with pytest.raises(ValueError, match="add_rms_norm"):
        triton_norms.add_rms_norm(x, torch.zeros((2, 4), device=device), torch.zeros(8, device=device), EPS)
    with pytest.raises(ValueError, match="norm_rotary"):
        triton_norms.norm_rotary(x.view(2, 1, 8), torch.zeros(8, device=device), torch.zeros((2, 3), device=device),
                                 torch.zeros((2, 3), device=device), EPS)
