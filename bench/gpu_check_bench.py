"""gpu_check's ``kernels`` section: each Triton form timed at the run's shapes, then the hq-e8-2b forms.

It first times paged attention (KV write, decode, prefill), the gated delta
rule (chunked and recurrent) and the causal conv (varlen and update), then
the hq-e8-2b forms (quantize-on-write, decode and prefill attention over
compressed pages + a 64-token exact window), whose GB/s counts the compressed
bytes read. Each has its own share of the budget. Headline figures go into
``head`` from each op's largest case.

Imported by ``bench/gpu_check.py`` once it has set ``TRITON_INTERPRET`` and called ``use_checkout()``.
"""

from __future__ import annotations

import time

import torch

from gpu_check_report import Report
from gpu_check_shapes import PAGE, Shapes
from gpu_check_timing import Bench, page_tables


def bench_attention(b: Bench, head: dict) -> None:
    from ignis.kernels.paged_attention import reference as ref
    from ignis.kernels.paged_attention import triton_decode, triton_prefill, triton_write

    s, dev, el = b.s, b.dev, 2
    pages = lambda bsz, ctx: bsz * ((ctx + PAGE - 1) // PAGE)  # noqa: E731
    num_pages = max([pages(bsz, c) for bsz, c in s.decode] + [pages(1, c) for _, c in s.prefill])
    if dev == "cuda":  # K and V pools within 40% of free memory
        num_pages = min(num_pages, int(0.4 * torch.cuda.mem_get_info()[0]) // (2 * PAGE * s.hkv * s.d * el))
    k_cache, v_cache = b.randn(num_pages, PAGE, s.hkv, s.d), b.randn(num_pages, PAGE, s.hkv, s.d)
    scale = s.d ** -0.5
    for t in s.write_tokens:
        key, value = b.randn(t, s.hkv, s.d), b.randn(t, s.hkv, s.d)
        slots = torch.randperm(num_pages * PAGE, device=dev)[:t]
        b.case("write_kv", f"T={t}", lambda: triton_write.write_kv(k_cache, v_cache, key, value, slots),
               nbytes=4 * t * s.hkv * s.d * el, flops=0)
    for bsz, ctx in s.decode:
        if pages(bsz, ctx) > num_pages:
            b.rep.say(f"decode_attention   B={bsz} ctx={ctx}: skipped (only {num_pages} pages fit in memory)")
            continue
        table = page_tables(b, num_pages, bsz, ctx)
        lens = torch.full((bsz,), ctx, dtype=torch.int32, device=dev)
        q = b.randn(bsz, s.hq, s.d)
        r = b.case("decode_attention", f"B={bsz} ctx={ctx}",
                   lambda: triton_decode.decode_attention(q, k_cache, v_cache, table, lens, scale),
                   nbytes=(2 * bsz * ctx * s.hkv * s.d + 2 * bsz * s.hq * s.d) * el,
                   flops=4 * bsz * s.hq * s.d * ctx,
                   check=lambda: (triton_decode.decode_attention(q, k_cache, v_cache, table, lens, scale),
                                  ref.decode_attention(q, k_cache, v_cache, table, lens, scale)))
        if r is not None:
            head[f"decode_attn_b{bsz}_gbps"] = f"{r[1]:.3g}"
            if bsz == 1:
                head["decode_attn_64k_gbps"] = f"{r[1]:.3g}"
    for n, ctx in s.prefill:
        table = page_tables(b, num_pages, 1, ctx)
        lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
        cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
        q = b.randn(n, s.hq, s.d)
        r = b.case("prefill_attention", f"chunk={n} ctx={ctx}",
                   lambda: triton_prefill.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale),
                   nbytes=(2 * ctx * s.hkv * s.d + 2 * n * s.hq * s.d) * el,
                   flops=4 * s.hq * s.d * (n * (ctx - n) + n * (n + 1) / 2),
                   check=lambda: (triton_prefill.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale),
                                  ref.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale)))
        if r is not None:
            head["prefill_attn_tflops"] = f"{r[2]:.3g}"
        if (n, ctx) != s.prefill[0]:
            continue
        gate = b.randn(n, s.hq, s.d)  # the output gate in the epilogue: one more read of a query's size
        b.case("prefill_attn_gated", f"chunk={n} ctx={ctx}",
               lambda: triton_prefill.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale, gate=gate),
               nbytes=(2 * ctx * s.hkv * s.d + 3 * n * s.hq * s.d) * el,
               flops=4 * s.hq * s.d * (n * (ctx - n) + n * (n + 1) / 2),
               check=lambda: (triton_prefill.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale, gate=gate),
                              ref.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale, gate=gate)))
    if dev == "cuda":  # the tile choice against alternatives, on the 8K chunk at 8K context
        n = ctx = max(c for c, _ in s.prefill)
        table = page_tables(b, num_pages, 1, ctx)
        lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
        cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
        q = b.randn(n, s.hq, s.d)
        flops = 4 * s.hq * s.d * n * (n + 1) / 2
        for cfg in ((64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 2), (128, 64, 8, 1),
                    (64, 64, 4, 2), (128, 128, 8, 1)):
            try:
                b.case("prefill_tiles", f"BM,BN,w,st={cfg}",
                       lambda cfg=cfg: triton_prefill.prefill_attention(q, k_cache, v_cache, table, cu, lens, scale,
                                                                        blocks=cfg),
                       nbytes=2 * ctx * s.hkv * s.d * el, flops=flops)
            except Exception as exc:  # a tile that does not fit: say so, keep going
                b.rep.say(f"prefill_tiles      {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
    del k_cache, v_cache


def bench_linear(b: Bench, head: dict) -> None:
    from ignis.kernels.causal_conv import reference as conv_ref
    from ignis.kernels.causal_conv import triton_conv
    from ignis.kernels.gated_delta_rule import reference as gdr_ref
    from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent

    s, dev = b.s, b.dev
    lanes = max(s.batches)
    pool = b.randn(lanes, s.hv, s.dk, s.dv, dtype=torch.float32, scale=0.1)

    def gdn_inputs(t):
        g = -torch.nn.functional.softplus(b.randn(t, s.hv, dtype=torch.float32)) * 0.5
        return (b.randn(t, s.hk, s.dk), b.randn(t, s.hk, s.dk), b.randn(t, s.hv, s.dv), g,
                torch.sigmoid(b.randn(t, s.hv)))

    per_tok = 2 * 64 * (3 * s.dk + 2 * s.dv) + 6 * s.dk * s.dv

    def gdn_bytes(t):
        """Inputs in bf16; u, w written and read, u rewritten as v_new and read (fp32); the bf16
        chunk-start states written and read."""
        return (t * (2 * s.hk * s.dk + 2 * s.hv * s.dv) * 2 + 2 * t * s.hv * (s.dk + s.dv) * 4
                + 2 * t * s.hv * s.dv * 4 + 2 * -(-t // 64) * s.hv * s.dk * s.dv * 2)

    for t in s.gdn_tokens:
        q, k, v, g, beta = gdn_inputs(t)
        slots = torch.tensor([0], device=dev)
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        nbytes = gdn_bytes(t)

        def check(q=q, k=k, v=v, g=g, beta=beta, slots=slots, cu=cu):
            a, c = pool.clone(), pool.clone()
            return (torch.cat([triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, a, slots, cu).flatten(),
                               a[0].flatten()]),
                    torch.cat([gdr_ref.chunk_gated_delta_rule(q, k, v, g, beta, c, slots, cu).flatten(),
                               c[0].flatten()]))

        r = b.case("gdn_chunk", f"T={t}",
                   lambda: triton_chunk.chunk_gated_delta_rule(q, k, v, g, beta, pool, slots, cu),
                   nbytes=nbytes, flops=per_tok * t * s.hv, check=check)
        if r is not None:
            head["gdn_chunk_ms"] = f"{r[0]:.3g}"
        # kernel 1 alone: k and v read, u and w written in fp32
        r = b.case("gdn_wy", f"T={t}", lambda: triton_chunk.chunk_wy(k, v, g, beta, cu),
                   nbytes=t * (s.hk * s.dk + s.hv * s.dv) * 2 + 4 * t * s.hv * (s.dk + s.dv),
                   flops=2 * 64 * (2 * s.dk + s.dv) * t * s.hv)
        if r is not None:
            head["gdn_wy_ms"] = f"{r[0]:.3g}"
    if dev == "cuda":  # the state and output pass tiles against alternatives, on one 8K sequence
        t = s.gdn_tokens[0]
        q, k, v, g, beta = gdn_inputs(t)
        slots = torch.tensor([0], device=dev)
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        # the last two: the WY kernel's warps and register cap (8 warps spill ~400 bytes a thread on
        # sm_90; capped to 128 registers two programs share an SM)
        # (state 8 warps and 2 stages were measured and left: triton_chunk's docstring)
        for cfg in ((32, 4, 1, 32, 4), (64, 8, 1, 32, 4), (32, 4, 1, 64, 4),
                    (32, 4, 1, 64, 8), (32, 4, 1, 64, 4, 8, 128), (32, 4, 1, 64, 4, 4, 0)):
            try:
                b.case("gdn_tiles", f"state BV,w,st/out BV,w[/wy w,maxnreg]={cfg}",
                       lambda cfg=cfg: triton_chunk.chunk_gated_delta_rule(
                           q, k, v, g, beta, pool, slots, cu, blocks=triton_chunk.ChunkBlocks(*cfg)),
                       nbytes=gdn_bytes(t), flops=per_tok * t * s.hv)
            except Exception as exc:  # a tile that does not fit: say so, keep going
                b.rep.say(f"gdn_tiles          {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
    for bsz in s.batches:
        q, k, v, g, beta = gdn_inputs(bsz)
        slots = torch.randperm(lanes, device=dev)[:bsz]

        def check(q=q, k=k, v=v, g=g, beta=beta, slots=slots):
            a, c = pool.clone(), pool.clone()
            return (torch.cat([triton_recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, a, slots).flatten(),
                               a.flatten()]),
                    torch.cat([gdr_ref.recurrent_gated_delta_rule(q, k, v, g, beta, c, slots).flatten(),
                               c.flatten()]))

        r = b.case("gdn_recurrent", f"B={bsz}",
                   lambda: triton_recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, pool, slots),
                   nbytes=2 * bsz * s.hv * s.dk * s.dv * 4, flops=6 * bsz * s.hv * s.dk * s.dv, check=check)
        if r is not None:
            head["gdn_recurrent_gbps"] = f"{r[1]:.3g}"
    c, kw = s.conv_dim, s.taps
    weight = b.randn(c, kw, scale=0.5)
    conv_pool = b.randn(lanes, c, kw - 1)
    for t in s.conv_tokens:
        x = b.randn(t, c)
        slots = torch.tensor([1], device=dev)
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)

        def check(x=x, slots=slots, cu=cu):
            a, d = conv_pool.clone(), conv_pool.clone()
            return (triton_conv.causal_conv1d_varlen(x, weight, a, slots, cu),
                    conv_ref.causal_conv1d_varlen(x, weight, d, slots, cu))

        r = b.case("conv_varlen", f"T={t}",
                   lambda: triton_conv.causal_conv1d_varlen(x, weight, conv_pool, slots, cu),
                   nbytes=4 * t * c, flops=2 * kw * c * t, check=check)
        if r is not None:
            head["conv_varlen_gbps"] = f"{r[1]:.3g}"
    for bsz in s.batches:
        x = b.randn(bsz, c)
        slots = torch.randperm(lanes, device=dev)[:bsz]

        def check(x=x, slots=slots):
            a, d = conv_pool.clone(), conv_pool.clone()
            return (triton_conv.causal_conv1d_update(x, weight, a, slots),
                    conv_ref.causal_conv1d_update(x, weight, d, slots))

        b.case("conv_update", f"B={bsz}", lambda: triton_conv.causal_conv1d_update(x, weight, conv_pool, slots),
               nbytes=bsz * c * (4 + 4 * (kw - 1)), flops=2 * kw * c * bsz, check=check)


HQ_WINDOW = 64


def bench_hq(b: Bench, head: dict) -> None:
    """hq-e8-2b: quantize-on-write, decode and prefill attention (window of HQ_WINDOW exact tokens)."""
    from ignis.kernels.hq_e8 import codec
    from ignis.kernels.hq_e8 import reference as ref
    from ignis.kernels.hq_e8 import triton_decode, triton_prefill, triton_write

    s, dev = b.s, b.dev
    width = codec.row_width(s.hkv, s.d)
    row_bytes = 2 * width  # one token, one layer, keys or values
    pages = lambda bsz, ctx: bsz * ((ctx + PAGE - 1) // PAGE)  # noqa: E731
    num_pages = max([pages(bsz, c) for bsz, c in s.decode] + [pages(1, c) for _, c in s.prefill])
    lanes = max(bsz for bsz, _ in s.decode)
    # every 16-bit word is a valid code: random codes, every scale 1.0 (bf16 0x3F80)
    kp = torch.randint(-(1 << 15), 1 << 15, (num_pages, PAGE, width), dtype=torch.int16, device=dev)
    kp[..., width - width // 9:] = 0x3F80
    vp = kp.flip(0).contiguous()
    kw, vw = b.randn(lanes, HQ_WINDOW, s.hkv, s.d), b.randn(lanes, HQ_WINDOW, s.hkv, s.d)
    scale = s.d ** -0.5
    for t in s.write_tokens:
        key, value = b.randn(t, s.hkv, s.d), b.randn(t, s.hkv, s.d)
        slots = torch.randperm(num_pages * PAGE, device=dev)[:t]

        def check(key=key, value=value, slots=slots):
            got = [torch.zeros_like(kp), torch.zeros_like(kp)]
            want = [torch.zeros_like(kp), torch.zeros_like(kp)]
            triton_write.write_kv(*got, key, value, slots)
            ref.write_kv(*want, key, value, slots)
            rows = lambda pools: torch.cat([codec.dequantize_kv(p.view(-1, width)[slots], s.hkv, s.d)  # noqa: E731
                                            for p in pools])
            return rows(got), rows(want)

        b.case("hq_write_kv", f"T={t}", lambda: triton_write.write_kv(kp, vp, key, value, slots),
               nbytes=2 * t * (s.hkv * s.d * 2 + row_bytes), flops=0, check=check, tol=1e-3)
    for bsz, ctx in s.decode:
        if pages(bsz, ctx) > num_pages:
            continue
        table = page_tables(b, num_pages, bsz, ctx)
        lens = torch.full((bsz,), ctx, dtype=torch.int32, device=dev)
        ln = torch.arange(bsz, device=dev)
        q = b.randn(bsz, s.hq, s.d)
        r = b.case("hq_decode_attn", f"B={bsz} ctx={ctx}",
                   lambda: triton_decode.decode_attention(q, kp, vp, kw, vw, table, lens, ln, scale),
                   nbytes=2 * bsz * ctx * row_bytes + 4 * bsz * s.hq * s.d,
                   flops=4 * bsz * s.hq * s.d * ctx,
                   check=lambda: (triton_decode.decode_attention(q, kp, vp, kw, vw, table, lens, ln, scale),
                                  ref.decode_attention(q, kp, vp, kw, vw, table, lens, ln, scale)))
        if r is not None:
            head[f"hq_decode_b{bsz}_gbps"] = f"{r[1]:.3g}"
    for n, ctx in s.prefill:
        table = page_tables(b, num_pages, 1, ctx)
        lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
        cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
        ln = torch.zeros(1, dtype=torch.int64, device=dev)
        q, key, value = b.randn(n, s.hq, s.d), b.randn(n, s.hkv, s.d), b.randn(n, s.hkv, s.d)
        args = (q, key, value, kp, vp, kw, vw, table, cu, lens, ln, scale)
        r = b.case("hq_prefill_attn", f"chunk={n} ctx={ctx}", lambda: triton_prefill.prefill_attention(*args),
                   nbytes=2 * ctx * row_bytes + 2 * n * (s.hq + s.hkv) * s.d * 2,
                   flops=4 * s.hq * s.d * (n * (ctx - n) + n * (n + 1) / 2),
                   check=lambda: (triton_prefill.prefill_attention(*args), ref.prefill_attention(*args)))
        if r is not None:
            head["hq_prefill_tflops"] = f"{r[2]:.3g}"
    del kp, vp


def run_bench(rep: Report, shapes: Shapes, device: str, deadline: float, head: dict) -> None:
    """The bf16 forms until 70% of the time left, then the hq-e8-2b forms until ``deadline``."""
    b = Bench(rep, shapes, device, time.monotonic() + 0.7 * (deadline - time.monotonic()))
    for part in (bench_attention, bench_linear):
        try:
            part(b, head)
        except Exception as exc:  # report and go on: one broken op must not hide the others
            rep.fail(f"bench {part.__name__}: {type(exc).__name__}: {exc}")
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if b.skipped:
        rep.say(f"bench: {b.skipped} cases skipped past their deadline")
    hq = Bench(rep, shapes, device, deadline)
    try:
        bench_hq(hq, head)
    except Exception as exc:
        rep.fail(f"bench bench_hq: {type(exc).__name__}: {exc}")
    if hq.skipped:
        rep.say(f"hq: {hq.skipped} cases skipped past the deadline")
