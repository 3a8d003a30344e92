"""KV formats side by side: bytes per token, what a budget holds, and decode attention time on the CPU twins.

For the 27B and Qwen3-Next shapes it prints bf16 and hq-e8-2b bytes per token
and the tokens a 16 GiB pool holds; then it times one decode-attention call
of each format's torch twin on the same keys and values (8 sequences at a
1K-token context, 16 query heads, 4 kv heads, head dim 128). The GPU kernels
are timed in bench/gpu_check.py. Last line:
``BENCH kv_format bytes_ratio=A attn_time_ratio=B`` (bf16 / hq-e8-2b bytes
per token on the 27B; hq-e8-2b / bf16 decode time).

    python bench/kv_format.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from ignis.engine.models.checkpoint_shapes import QWEN35_27B, QWEN3_NEXT_80B  # noqa: E402
from ignis.engine.models.config import config_from_dict  # noqa: E402
from ignis.kernels.hq_e8 import reference as hq  # noqa: E402
from ignis.kernels.paged_attention import reference as bf  # noqa: E402

SHAPES = {"27B": QWEN35_27B, "Qwen3-Next-80B": QWEN3_NEXT_80B}
BUDGET = 16 << 30


def best_of(reps: int, fn) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def attention_times(batch: int, ctx: int, hq_heads: int, hkv: int, d: int, window: int, reps: int):
    gen = torch.Generator().manual_seed(0)
    pages_per = -(-ctx // 64)
    num_pages = batch * pages_per
    table = torch.arange(num_pages, dtype=torch.int32).view(batch, pages_per)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    k = torch.randn(num_pages * 64, hkv, d, generator=gen)
    v = torch.randn(num_pages * 64, hkv, d, generator=gen)
    q = torch.randn(batch, hq_heads, d, generator=gen)
    k_cache, v_cache = k.view(num_pages, 64, hkv, d), v.view(num_pages, 64, hkv, d)
    width = hq.codec.row_width(hkv, d)
    k_pages = torch.zeros(num_pages, 64, width, dtype=torch.int16)
    v_pages = torch.zeros_like(k_pages)
    slots = torch.arange(num_pages * 64)
    hq.write_kv(k_pages, v_pages, k, v, slots)
    lanes = torch.arange(batch)
    k_win = torch.zeros(batch, window, hkv, d)
    v_win = torch.zeros(batch, window, hkv, d)
    for b in range(batch):  # the ring holds each sequence's last `window` positions
        for t in range(ctx - window, ctx):
            row = b * pages_per * 64 + t
            k_win[b, t % window], v_win[b, t % window] = k[row], v[row]
    scale = d ** -0.5
    t_bf = best_of(reps, lambda: bf.decode_attention(q, k_cache, v_cache, table, lens, scale))
    t_hq = best_of(reps, lambda: hq.decode_attention(q, k_pages, v_pages, k_win, v_win, table, lens, lanes, scale))
    exact = bf.decode_attention(q, k_cache, v_cache, table, lens, scale)
    approx = hq.decode_attention(q, k_pages, v_pages, k_win, v_win, table, lens, lanes, scale)
    err = float((approx - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())
    return t_bf, t_hq, err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for the test suite")
    args = ap.parse_args(argv)
    print(f"{'model':<16}{'bf16 B/tok':>12}{'hq B/tok':>10}{'bf16 tokens/16GiB':>20}{'hq tokens/16GiB':>18}")
    ratios = {}
    for name, raw in SHAPES.items():
        cfg = config_from_dict(raw)
        b16, hqb = cfg.kv_bytes_per_token("bf16"), cfg.kv_bytes_per_token("hq-e8-2b")
        ratios[name] = b16 / hqb
        print(f"{name:<16}{b16:>12,}{hqb:>10,}{cfg.max_context_for_pool(BUDGET, 'bf16'):>20,}"
              f"{cfg.max_context_for_pool(BUDGET, 'hq-e8-2b'):>18,}")
    batch, ctx, reps = (8, 1024, 3) if not args.quick else (2, 128, 1)
    t_bf, t_hq, err = attention_times(batch, ctx, 16, 4, 128, 64, reps)
    print(f"decode attention, {batch} seqs x {ctx} tokens (CPU twins): bf16 {t_bf * 1e3:.2f} ms, "
          f"hq-e8-2b {t_hq * 1e3:.2f} ms, relative RMS error {err:.3f}")
    print(f"BENCH kv_format bytes_ratio={ratios['27B']:.3f} attn_time_ratio={t_hq / t_bf:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
