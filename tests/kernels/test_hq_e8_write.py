"""hq-e8-2b writes: the Triton quantize-on-write and window kernels against their torch twins.

Under the interpreter the Triton encoder produces the twin's codes bit for
bit (same sums in the same order, same tie breaks). On a GPU, fused
multiply-adds may move a near-tie the other way: there at most 1 in 1,000
codes may differ, and the decoded values agree to 1e-2 relative RMS.
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.models.state import POISON_ROW
from ignis.kernels.hq_e8 import codec
from ignis.kernels.hq_e8 import reference as ref
from ignis.kernels.hq_e8 import triton_write
from tests.kernels.conftest import PAGE, assert_close, assert_untouched, cu_seqlens, strided


def _compare_pages(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor, hkv: int, d: int, device) -> None:
    width = got.shape[-1]
    g, w = got.view(-1, width)[rows], want.view(-1, width)[rows]
    differ = float((g != w).float().mean())
    print(f"int16 words that differ: {differ:.2e}")
    if device.type == "cpu":
        assert torch.equal(g, w)
    else:
        assert differ <= 1e-3
        assert_close(codec.dequantize_kv(g.cpu(), hkv, d), codec.dequantize_kv(w.cpu(), hkv, d), 1e-2, "decoded")


@pytest.mark.parametrize("hkv,d,dtype", [(2, 32, torch.float32), (1, 64, torch.bfloat16), (2, 128, torch.float32)])
def test_quantize_on_write_matches_twin(device, gen, hkv, d, dtype):
    pages, t = 3, 7
    width = codec.row_width(hkv, d)
    key = strided((t, hkv, d), dtype, device, gen, scale=2.0)
    value = strided((t, hkv, d), dtype, device, gen, scale=0.5)
    key[2] = 0.0  # an all-zero token row
    slots = torch.randperm(pages * PAGE, generator=gen)[:t].to(device)
    slots[5] = -1
    pool = torch.full((2, pages, PAGE, width), POISON_ROW, dtype=torch.int16, device=device)
    want = pool.clone()
    triton_write.write_kv(pool[0], pool[1], key, value, slots)
    ref.write_kv(want[0], want[1], key, value, slots)
    written = slots[slots >= 0]
    for half in (0, 1):
        _compare_pages(pool[half], want[half], written, hkv, d, device)
    untouched = sorted(set(range(pages * PAGE)) - set(written.tolist()))
    flat = pool.view(2, pages * PAGE, width)
    assert bool((flat[:, untouched] == POISON_ROW).all()), "rows of skipped or unused slots were written"


def test_quantized_rows_decode_close_to_the_input(device, gen):
    key = strided((12, 2, 64), torch.float32, device, gen)
    pool = torch.zeros((2, 1, PAGE, codec.row_width(2, 64)), dtype=torch.int16, device=device)
    triton_write.write_kv(pool[0], pool[1], key, key, torch.arange(12, device=device))
    back = codec.dequantize_kv(pool[0, 0, :12].cpu(), 2, 64)
    assert_close(back, key.cpu(), 0.36, "decoded keys vs written keys")  # ~0.30 for Gaussian data


@pytest.mark.parametrize("window", [4, 16])
def test_window_write_matches_twin(device, gen, window):
    lanes, hkv, d = 5, 2, 32
    # sequences: a 10-token chunk (longer than a 4 window), a decode step, a 3-token chunk
    n = [10, 1, 3]
    lens = torch.tensor([10, 37, 20], dtype=torch.int32, device=device)
    lane = torch.tensor([3, 0, 4], device=device)
    cu = cu_seqlens(n, device)
    key = strided((sum(n), hkv, d), torch.float32, device, gen)
    value = strided((sum(n), hkv, d), torch.float32, device, gen)
    kw = torch.full((lanes, window, hkv, d), float("nan"), device=device)
    vw = torch.full_like(kw, float("nan"))
    kw2, vw2 = kw.clone(), vw.clone()
    triton_write.window_write(kw, vw, key, value, cu, lens, lane)
    ref.window_write(kw2, vw2, key, value, cu, lens, lane)
    for got, want in ((kw, kw2), (vw, vw2)):
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all())
    # lane 3 holds the chunk's last min(10, W) tokens at pos % W
    keep = min(10, window)
    for i in range(keep):
        pos = 10 - keep + i
        assert torch.equal(kw[3, pos % window], key[pos])
    assert_untouched(kw, torch.full_like(kw, float("nan")), [1, 2], "window lanes")
