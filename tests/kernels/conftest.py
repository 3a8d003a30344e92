"""Kernel tests: where the Triton forms run, and the shared comparison helpers.

``IGNIS_TEST_DEVICE=cuda`` runs every Triton form compiled on the GPU;
otherwise (the default, and CI) ``TRITON_INTERPRET=1`` is set here and the
kernels run in Triton's interpreter on CPU tensors. Triton reads the flag
when it decorates a function, its own library included, so the flag only
takes in a process that imports triton after this file. When something
imported triton earlier (a test module collected before this directory),
the in-process kernel tests are skipped and
``test_backend.py::test_kernel_suite_in_a_fresh_process`` runs them in a
subprocess instead.
"""

from __future__ import annotations

import os

DEVICE = os.environ.get("IGNIS_TEST_DEVICE", "cpu").strip().lower() or "cpu"
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"IGNIS_TEST_DEVICE: expected 'cpu' or 'cuda', got {DEVICE!r}")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton.language.standard  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("IGNIS_TEST_DEVICE=cuda but torch sees no CUDA device")

IN_PROCESS = DEVICE == "cuda" or isinstance(triton.language.standard.sigmoid, InterpretedFunction)
"""False when triton was imported before the interpreter flag was set."""
FRESH_PROCESS_TEST = "test_kernel_suite_in_a_fresh_process"
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    if IN_PROCESS:
        return
    skip = pytest.mark.skip(reason="triton was imported before TRITON_INTERPRET=1; "
                                   f"{FRESH_PROCESS_TEST} runs this directory in a subprocess")
    for item in items:
        if str(item.path).startswith(HERE) and item.name != FRESH_PROCESS_TEST:
            item.add_marker(skip)


PAGE = 64


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want||_rms / ||want||_rms in fp64; NaN anywhere makes it NaN (and fails ``<``)."""
    got, want = got.double(), want.double()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> float:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = rel_rms(got, want)
    print(f"{what}: relative RMS error {err:.2e} (tolerance {tol:.0e})")
    assert err < tol, f"{what}: relative RMS error {err:.3e} >= {tol:.1e}"
    return err


def assert_untouched(after: torch.Tensor, before: torch.Tensor, index: list[int], what: str) -> None:
    """Rows ``index`` of ``after`` are bitwise what they were (NaN stays NaN)."""
    if not index:
        return
    a, b = after[index], before[index]
    same = (a == b) | (a.isnan() & b.isnan())
    assert bool(same.all()), f"{what}: unused rows {index} were written"


def cu_seqlens(lengths: list[int], device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def strided(shape: tuple[int, ...], dtype: torch.dtype, device, gen: torch.Generator,
            scale: float = 1.0) -> torch.Tensor:
    """A random tensor that is a non-contiguous view (every row padded by one extra last-dim block)."""
    base = torch.randn((*shape[:-1], 2 * shape[-1]), generator=gen) * scale
    return base.to(device=device, dtype=dtype)[..., shape[-1]:]


@pytest.fixture(autouse=True)
def nan_empty(monkeypatch):
    """Every ``torch.empty``/``empty_like`` float buffer starts as NaN (outputs, scratch,
    partials), so a kernel that leaves an element unwritten, or reads one it never
    wrote, fails its comparison."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


@pytest.fixture
def device() -> torch.device:
    return torch.device(DEVICE)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
