"""gpu_check ``--compile-only``: every kernel launch compiled for sm_90 without a GPU.

Every wrapper runs on meta tensors at the 27B shapes (bf16) and the largest
test shapes (fp32); the launches are captured instead of run, and each
distinct one is compiled for sm_90 the way the JIT would specialise it. A
compile error, or shared memory above the H200's 227 KB, is a failure. The
compiles run in forked workers, one per core.

Imported by ``bench/gpu_check.py`` once it has cleared ``TRITON_INTERPRET`` and called ``use_checkout()``:
compiling needs real JIT functions, not interpreted ones.
"""

from __future__ import annotations

import torch

from gpu_check_report import Report
from gpu_check_shapes import FULL, PAGE, Shapes


SM90_SHARED = 232448  # bytes of shared memory one block may use on H100/H200
TL_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            torch.int16: "i16", torch.int32: "i32", torch.int64: "i64"}


def _kernels() -> list:
    from ignis.kernels.causal_conv import triton_conv
    from ignis.kernels.fused import triton_norms, triton_pointwise
    from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent, triton_wy
    from ignis.kernels.hq_e8 import triton_decode as hq_decode
    from ignis.kernels.hq_e8 import triton_prefill as hq_prefill
    from ignis.kernels.hq_e8 import triton_write as hq_write
    from ignis.kernels.paged_attention import triton_decode, triton_prefill, triton_write

    return [triton_write._write_kv_kernel, triton_prefill._prefill_kernel, triton_decode._decode_split_kernel,
            triton_decode._decode_reduce_kernel, triton_wy._chunk_wy_kernel, triton_chunk._chunk_state_kernel,
            triton_chunk._chunk_out_kernel,
            triton_recurrent._recurrent_kernel, triton_conv._conv_varlen_kernel, triton_conv._conv_update_kernel,
            hq_write._quantize_kernel, hq_write._window_write_kernel, hq_decode._decode_split_kernel,
            hq_prefill._prefill_kernel, triton_norms._rms_norm_kernel, triton_norms._gated_norm_kernel,
            triton_norms._norm_rotary_kernel, triton_pointwise._gate_mul_kernel, triton_pointwise._gdn_gating_kernel]


def _launch_all(s: Shapes, dtype: torch.dtype) -> None:
    """Call every wrapper once on meta tensors (host-side metadata on the CPU)."""
    from ignis.kernels.causal_conv import triton_conv
    from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent
    from ignis.kernels.paged_attention import triton_decode, triton_prefill, triton_write

    meta = torch.device("meta")

    def e(*shape, dt=dtype):
        return torch.empty(shape, dtype=dt, device=meta)

    n, ctx, bsz = 256, 1024, 8
    cu = torch.tensor([0, n], dtype=torch.int32)
    kc, vc = e(ctx // PAGE, PAGE, s.hkv, s.d), e(ctx // PAGE, PAGE, s.hkv, s.d)
    table, lens = e(bsz, ctx // PAGE, dt=torch.int32), e(bsz, dt=torch.int32)
    triton_write.write_kv(kc, vc, e(n, s.hkv, s.d), e(n, s.hkv, s.d), e(n, dt=torch.int64))
    triton_prefill.prefill_attention(e(n, s.hq, s.d), kc, vc, table[:1], cu, lens[:1], 0.1)
    triton_prefill.prefill_attention(e(n, s.hq, s.d), kc, vc, table[:1], cu, lens[:1], 0.1, gate=e(n, s.hq, s.d))
    triton_decode.decode_attention(e(bsz, s.hq, s.d), kc, vc, table, lens, 0.1)
    g, slots = e(n, s.hv, dt=torch.float32), e(bsz, dt=torch.int64)
    q, v, beta, pool = e(n, s.hk, s.dk), e(n, s.hv, s.dv), e(n, s.hv), e(bsz, s.hv, s.dk, s.dv, dt=torch.float32)
    triton_chunk.chunk_gated_delta_rule(q, q, v, g, beta, pool, slots[:1], cu)
    triton_recurrent.recurrent_gated_delta_rule(q[:bsz], q[:bsz], v[:bsz], g[:bsz], beta[:bsz], pool, slots)
    x, w, conv_pool = e(n, s.conv_dim), e(s.conv_dim, s.taps), e(bsz, s.conv_dim, s.taps - 1)
    triton_conv.causal_conv1d_varlen(x, w, conv_pool, slots[:1], cu)
    triton_conv.causal_conv1d_update(x[:bsz], w, conv_pool, slots)
    _launch_hq(s, dtype, e, n, ctx, bsz, cu, table, lens)
    _launch_fused(s, e, n)


def _launch_fused(s: Shapes, e, n: int) -> None:
    """The fused norms and gates every layer runs (at the end-to-end model's hidden and MLP sizes)."""
    from ignis.kernels.fused import triton_norms, triton_pointwise

    cfg = s.e2e.get("model", {})
    hidden, inter = cfg.get("hidden_size", s.hq * s.d), cfg.get("intermediate_size", 4 * s.hq * s.d)
    w = e(hidden)
    triton_norms.rms_norm(e(n, hidden), w, 1e-6)
    triton_norms.add_rms_norm(e(n, hidden), e(n, hidden), w, 1e-6)
    triton_norms.gated_rms_norm(e(n, s.hv, s.dv), e(n, s.hv, s.dv), e(s.dv), 1e-6)
    qg = e(n, s.hq, 2 * s.d)  # query and gate of a gated attention layer, one projection
    triton_norms.norm_rotary(qg[..., :s.d], e(s.d), e(n, s.d // 4), e(n, s.d // 4), 1e-6)
    triton_pointwise.silu_mul(e(n, inter), e(n, inter))
    triton_pointwise.sigmoid_mul(e(n, s.hq, s.d), qg[..., s.d:])
    triton_pointwise.gdn_gating(e(n, s.hv), e(n, s.hv), e(s.hv, dt=torch.float32), e(s.hv, dt=torch.float32))


def _launch_hq(s: Shapes, dtype: torch.dtype, e, n: int, ctx: int, bsz: int, cu, table, lens) -> None:
    from ignis.kernels.hq_e8 import codec
    from ignis.kernels.hq_e8 import triton_decode as hq_decode
    from ignis.kernels.hq_e8 import triton_prefill as hq_prefill
    from ignis.kernels.hq_e8 import triton_write as hq_write

    width = codec.row_width(s.hkv, s.d)
    kp, vp = e(ctx // PAGE, PAGE, width, dt=torch.int16), e(ctx // PAGE, PAGE, width, dt=torch.int16)
    kw, vw = e(bsz, 64, s.hkv, s.d), e(bsz, 64, s.hkv, s.d)
    key, value, lanes = e(n, s.hkv, s.d), e(n, s.hkv, s.d), e(bsz, dt=torch.int64)
    hq_write.write_kv(kp, vp, key, value, e(n, dt=torch.int64))
    hq_write.window_write(kw, vw, key, value, cu, lens[:1], lanes[:1])
    hq_prefill.prefill_attention(e(n, s.hq, s.d), key, value, kp, vp, kw, vw, table[:1], cu, lens[:1], lanes[:1],
                                 0.1)
    hq_decode.decode_attention(e(bsz, s.hq, s.d), kp, vp, kw, vw, table, lens, lanes, 0.1)


def _signature(fn, args: tuple, kwargs: dict):
    """(signature, constexprs, attrs, options) as the JIT specialises a launch with these arguments."""
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
    values = dict(zip(fn.arg_names, args), **kwargs)
    constexpr_index = {p.num for p in fn.params if p.is_constexpr}
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = values[name]
        if i in constexpr_index or (isinstance(v, int) and not isinstance(v, bool) and v == 1):
            sig[name], consts[name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TL_TYPES[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, int):
            sig[name] = "i64" if abs(v) >= 2 ** 31 else "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, consts, attrs, options


def run_compile_only(rep: Report) -> int:
    """Compile every captured launch for sm_90; returns the number that compiled."""
    captured = []
    kernels = _kernels()
    for k in kernels:
        k.run = (lambda fn: lambda *a, grid=None, warmup=False, **kw: captured.append((fn, a, kw)))(k)
    small = Shapes(hq=6, hkv=1, d=128, hk=1, hv=1, dk=128, dv=128, taps=4, decode=(), prefill=(),
                   gdn_tokens=(), batches=(), conv_tokens=(), write_tokens=())
    try:
        for shapes, dtype in ((FULL, torch.bfloat16), (FULL, torch.float32), (small, torch.float32)):
            _launch_all(shapes, dtype)
    finally:
        for k in kernels:
            del k.run
    seen, jobs = set(), []
    for fn, args, kwargs in captured:
        sig, consts, attrs, options = _signature(fn, args, dict(kwargs))
        key = (fn.__name__, repr(sorted(sig.items())), repr(sorted(map(str, consts.items()))), repr(options))
        if key in seen:
            continue
        seen.add(key)
        what = fn.__name__ + " " + " ".join(f"{k}={v}" for k, v in consts.items() if k.isupper())
        jobs.append((fn, sig, consts, attrs, options, what))
    ok = 0
    for (_, _, _, _, options, what), (shared, error) in zip(jobs, _compile_all(jobs)):
        if error is not None:
            rep.fail(f"compile {what}: {error}")
            continue
        rep.say(f"compile {what} {options}: shared {shared} B")
        if shared > SM90_SHARED:
            rep.fail(f"compile {what}: {shared} B of shared memory exceeds {SM90_SHARED}")
        else:
            ok += 1
    return ok


_JOBS: list = []
"""The launches to compile, read by forked workers (a JIT function does not pickle; a fork inherits it)."""


def _compile_all(jobs: list) -> list[tuple[int | None, str | None]]:
    """(shared memory bytes, None) or (None, the error) per job, in order: on every core (forked workers each
    compile some: one compile is a second or more of single-threaded MLIR passes), serially where fork is not
    available."""
    import multiprocessing
    import os

    _JOBS[:] = jobs
    workers = min(len(jobs), os.cpu_count() or 1, 8)
    try:
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                return pool.map(_compile_one, range(len(jobs)), chunksize=1)
        return [_compile_one(i) for i in range(len(jobs))]
    finally:
        _JOBS.clear()


def _compile_one(i: int) -> tuple[int | None, str | None]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, sig, consts, attrs, options, _ = _JOBS[i]
    try:
        compiled = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                                  options=options)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[-600:]}"
    return compiled.metadata.shared, None
