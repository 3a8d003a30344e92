"""One GPU acceptance run of the Triton kernels: tests on the device, model equivalence, timings.

Sections, each with its own share of an 8-minute budget (a section past its
deadline skips its remaining cases and says so in the table):

1. tests: pytest on ``tests/kernels`` with ``IGNIS_TEST_DEVICE=cuda`` (kernels
   compiled, no interpreter); passed / failed counts from its verbose report
   (those finished by the deadline if it runs over).
2. model: a small random Qwen3.5 in bf16 (and fp32) on the GPU: HybridModel on
   the Triton forms against the same model on the torch twins over mixed
   decode + prefill batches, and, where transformers is importable, against
   transformers' forward (chunked prefill then decode steps against one full
   forward). Error is ``max|ours - ref| / max|ref|`` over the logits.
3. bench: each Triton form at Qwen3.5-27B shapes (24 q / 4 kv heads of 256;
   GDN 16 key / 48 value heads of 128; conv dim 10240), CUDA events, warm-up,
   median of several runs; achieved GB/s and TFLOP/s against the H200's
   ceilings (about 4.3 TB/s, 790 TFLOP/s dense bf16). The first case of each
   op is also checked against its twin. Small cases can sit in the 50 MB L2,
   so their GB/s can exceed what HBM gives.
4. hq: the hq-e8-2b forms (quantize-on-write, decode and prefill attention
   over compressed pages + a 64-token exact window) at the same shapes, with
   their own share of the budget; GB/s counts the compressed bytes read.
5. tiers: ``bench/gpu_tiers.py``, the engine <-> tierd copy path across two
   processes (CUDA IPC pool, pinned shared-memory slots, tierd's backend):
   bytes checked both ways, GB/s against torch's own device <-> pinned copy.

``--dry-run`` (alias ``--quick``) runs the same code on the CPU under
``TRITON_INTERPRET=1`` with tiny shapes. ``--compile-only`` needs no GPU
either: it runs every wrapper on meta tensors at the 27B shapes (bf16) and
the largest test shapes (fp32), captures the launches instead of running
them, and compiles each for sm_90 the way the JIT would specialise it,
failing on any compile error or on shared memory above the H200's 227 KB.

The table goes to ``--out`` (default ``bench/out/gpu_check.txt``) and is
copied to ``$OUT`` when that is set. The last line is ``BENCH gpu_check kernels_passed=N kernels_failed=M
model_max_rel_err=X ...`` (headline figures come from each op's largest case).

    python bench/gpu_check.py [--dry-run | --compile-only] [--out PATH]
"""

from __future__ import annotations

import os
import sys

DRY_RUN = "--dry-run" in sys.argv or "--quick" in sys.argv
if DRY_RUN:  # before anything imports triton: kernels are decorated for the interpreter
    os.environ["TRITON_INTERPRET"] = "1"
elif "--compile-only" in sys.argv:  # compiling needs real JIT functions, not interpreted ones
    os.environ.pop("TRITON_INTERPRET", None)

import argparse  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

import torch  # noqa: E402

HBM_GBPS = 4300.0
MMA_TFLOPS = 790.0
BUDGET_S = {"tests": 210.0, "model": 60.0, "bench": 115.0, "hq": 45.0, "tiers": 20.0}  # 450 s of 480
PAGE = 64


@dataclass(frozen=True)
class Shapes:
    hq: int
    hkv: int
    d: int
    hk: int
    hv: int
    dk: int
    dv: int
    taps: int
    decode: tuple  # (batch, context)
    prefill: tuple  # (chunk, context after the chunk)
    gdn_tokens: tuple
    batches: tuple  # recurrent and conv-update batch sizes
    conv_tokens: tuple
    write_tokens: tuple
    model: dict = field(default_factory=dict)
    model_tokens: tuple = (37, 33, 6)  # two prefill chunks, then decode steps

    @property
    def conv_dim(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv


def _model_cfg(hidden, layers, heads, kv, hd, lk, lv, ld, inter, vocab) -> dict:
    period = min(4, layers)  # every 4th layer full attention, as in the checkpoints; at least one
    types = ["full_attention" if (i + 1) % period == 0 else "linear_attention" for i in range(layers)]
    return {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "layer_types": types,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
            "linear_num_key_heads": lk, "linear_num_value_heads": lv, "linear_key_head_dim": ld,
            "linear_value_head_dim": ld, "linear_conv_kernel_dim": 4, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


K1, K4, K8, K16, K64 = 1024, 4096, 8192, 16384, 65536
FULL = Shapes(
    hq=24, hkv=4, d=256, hk=16, hv=48, dk=128, dv=128, taps=4,
    decode=tuple((b, c) for c in (K1, K4, K16, K64) for b in (1, 8, 64)),
    prefill=((2048, 2048), (2048, K16), (2048, K64), (K8, K8), (K8, K64)),
    gdn_tokens=(K1, K8, K64), batches=(1, 8, 64), conv_tokens=(K1, K8, K64), write_tokens=(64, K8),
    model=_model_cfg(256, 4, 6, 1, 64, 2, 4, 64, 512, 512), model_tokens=(150, 90, 8),
)
DRY = Shapes(
    hq=6, hkv=2, d=32, hk=2, hv=4, dk=16, dv=16, taps=4,
    decode=((1, 64), (3, 200)), prefill=((16, 16), (64, 200)), gdn_tokens=(64, 130), batches=(1, 3),
    conv_tokens=(64, 130), write_tokens=(5, 64),
    model=_model_cfg(32, 2, 4, 2, 16, 2, 4, 16, 48, 96), model_tokens=(37, 33, 3),
)


class Report:
    """Lines of the table and the failures, printed as they come."""

    def __init__(self):
        self.lines: list[str] = []
        self.failures: list[str] = []

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.say(f"FAIL {what}")


# ----- 1. kernel tests ------------------------------------------------------
def run_tests(rep: Report, device: str, budget: float) -> tuple[int, int]:
    if not _has("pytest"):
        rep.say("tests: skipped (pytest is not installed here)")
        return 0, 0
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/kernels",
           "--ignore=tests/kernels/test_gpu_check.py", "-o", "addopts="]
    env = dict(os.environ, IGNIS_TEST_DEVICE=device)
    if device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    else:  # the dry run exercises the runner on a few fast tests
        cmd += ["-k", "write_kv or selects or bad_env or split_plan"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget)
        out, timed_out = proc.stdout, False
    except subprocess.TimeoutExpired as exc:  # keep the verdicts printed so far
        raw = exc.stdout or b""
        out, timed_out = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw), True
    verdicts = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", out, re.MULTILINE)
    passed = sum(v in ("PASSED", "XFAIL") for _, v in verdicts)
    skipped = sum(v == "SKIPPED" for _, v in verdicts)
    bad = [name for name, v in verdicts if v in ("FAILED", "ERROR", "XPASS")]
    for name in bad:
        rep.fail(f"test {name}")
    failed = len(bad)
    if timed_out:
        rep.fail(f"tests: pytest ran past its {budget:.0f} s budget; counts are of the tests finished by then")
        failed += 1
    elif not verdicts:
        rep.fail(f"tests: pytest reported no tests (rc {proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}")
        failed += 1
    rep.say(f"tests: {passed} passed, {failed} failed, {skipped} skipped ({time.monotonic() - t0:.0f} s)")
    return passed, failed


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


# ----- 2. model equivalence -------------------------------------------------
def max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))


def _perturb_norms(model) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_((torch.randn(p.shape, generator=gen) * 0.2).to(p.device, p.dtype))


def _run_ours(model, ops, dtype, device, chunks_per_step):
    from ignis.engine.forward_batch import ForwardBatch
    from ignis.engine.models.state import ModelState

    model.ops = ops
    state = ModelState.allocate(model.cfg, num_pages=32, lanes=4, dtype=dtype, device=device, fill=float("nan"))
    return [model(ForwardBatch.build(chunks, device), state, all_logits=True) for chunks in chunks_per_step]


def run_model(rep: Report, shapes: Shapes, device: str, deadline: float) -> float:
    """Largest bf16 error over the comparisons (NaN when none ran)."""
    from ignis.engine.forward_batch import SeqChunk
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.hybrid import HybridModel
    from ignis.kernels.backend import REFERENCE, triton_ops

    cfg = config_from_dict(shapes.model)
    torch.manual_seed(0)
    base = HybridModel(cfg).eval()
    _perturb_norms(base)
    n1, n2, steps = shapes.model_tokens
    ids = torch.randint(0, cfg.vocab_size, (n1 + n2 + steps,), generator=torch.Generator().manual_seed(2)).tolist()
    pages_a = [9, 3, 17, 5, 30, 1, 12, 22][: (len(ids) + PAGE - 1) // PAGE]
    pages_b = [7, 26]
    # one sequence chunked then decoded, while a second one runs beside it
    mixed = [[SeqChunk(ids[:n1], 0, pages_a, 2), SeqChunk(ids[:5], 0, pages_b, 0)],
             [SeqChunk(ids[5:6], 5, pages_b, 0), SeqChunk(ids[n1:n1 + n2], n1, pages_a, 2)]]
    mixed += [[SeqChunk([ids[p]], p, pages_a, 2), SeqChunk([ids[6 + i]], 6 + i, pages_b, 0)]
              for i, p in enumerate(range(n1 + n2, len(ids)))]
    worst = float("nan")
    tols = {torch.bfloat16: 5e-2, torch.float32: 1e-4}
    for dtype in (torch.bfloat16, torch.float32):
        if time.monotonic() > deadline:
            rep.say(f"model: past the deadline, skipped {dtype}")
            continue
        model = HybridModel(cfg).to(device=device, dtype=dtype).eval()
        model.load_state_dict(base.state_dict())
        model.rotary.inv_freq = model.rotary.frequencies(device)
        want = _run_ours(model, REFERENCE, dtype, device, mixed)
        got = _run_ours(model, triton_ops(), dtype, device, mixed)
        err = max(max_rel(g, w) for g, w in zip(got, want))
        _model_row(rep, f"triton vs twins, {dtype}", err, tols[dtype])
        if dtype == torch.bfloat16:
            worst = err if worst != worst else max(worst, err)
        hf_err = _versus_transformers(rep, cfg, base, got, ids, n1, n2, dtype, device, tols[dtype])
        if hf_err is not None and dtype == torch.bfloat16:
            worst = max(worst, hf_err)
    return worst


def _model_row(rep: Report, what: str, err: float, tol: float) -> None:
    ok = err < tol
    rep.say(f"model: {what}: max rel err {err:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}")
    if not ok:
        rep.failures.append(f"model {what}")


def _versus_transformers(rep, cfg, base, got, ids, n1, n2, dtype, device, tol):
    """Sequence A's logits from the mixed run against transformers' single forward."""
    try:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    except ImportError:
        rep.say("model: transformers is not importable here; skipped that comparison")
        return None
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**hf_config(cfg))).eval()
    hf.load_state_dict({("model." + k if k != "lm_head.weight" else k): v for k, v in base.state_dict().items()})
    hf = hf.to(device=device, dtype=dtype)
    with torch.no_grad():
        want = hf(torch.tensor([ids], device=device), use_cache=False).logits[0]
    # sequence A is row 0 of step 0 (n1 tokens), the last n2 rows of step 1, row 0 of each decode step
    ours = torch.cat([got[0][:n1], got[1][-n2:]] + [g[:1] for g in got[2:]])
    err = max_rel(ours, want)
    _model_row(rep, f"triton vs transformers, {dtype}", err, tol)
    return err


def hf_config(cfg) -> dict:
    """transformers' Qwen3_5TextConfig arguments for our ModelConfig."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim}
    return {"rope_parameters": rope, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.conv_kernel, "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings}


# ----- 3. kernel timings ----------------------------------------------------
class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.warmup, self.iters = (3, 10) if self.cuda else (1, 1)

    def __call__(self, fn) -> float:
        """Median milliseconds of one call of ``fn``."""
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if sum(times) > 2000 and len(times) >= 3:
                break
        return statistics.median(times)


class Bench:
    """Times cases into table rows; checks the first case of each op against its twin."""

    def __init__(self, rep: Report, shapes: Shapes, device: str, deadline: float):
        self.rep, self.s, self.dev, self.deadline = rep, shapes, device, deadline
        self.timer = Timer(device)
        self.gen = torch.Generator(device=device).manual_seed(0)
        self.checked: set[str] = set()
        self.skipped = 0
        rep.say(f"{'op':<18} {'case':<24} {'ms':>9} {'GB/s':>8} {'%HBM':>6} {'TFLOP/s':>8} {'%MMA':>6}  check")

    def randn(self, *shape, dtype=torch.bfloat16, scale=1.0):
        t = torch.randn(shape, generator=self.gen, device=self.dev, dtype=dtype)
        return t.mul_(scale) if scale != 1.0 else t

    def case(self, op: str, name: str, fn, nbytes: float, flops: float, check=None, tol: float = 2e-2):
        if time.monotonic() > self.deadline:
            self.skipped += 1
            return None
        note = ""
        if check is not None and op not in self.checked:
            self.checked.add(op)
            got, want = check()
            err = rel_rms(got, want)
            note = f"rel_rms {err:.1e} {'ok' if err < tol else 'FAIL'}"
            if not err < tol:
                self.rep.failures.append(f"bench check {op} {name}")
        ms = self.timer(fn)
        gbps, tflops = nbytes / ms / 1e6, flops / ms / 1e9
        self.rep.say(f"{op:<18} {name:<24} {ms:9.3f} {gbps:8.1f} {100 * gbps / HBM_GBPS:5.1f}% "
                     f"{tflops:8.2f} {100 * tflops / MMA_TFLOPS:5.1f}%  {note}")
        return ms, gbps, tflops


def _tables(b: Bench, num_pages: int, bsz: int, ctx: int) -> torch.Tensor:
    per = (ctx + PAGE - 1) // PAGE
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(bsz * 7 + ctx))[: bsz * per]
    return perm.view(bsz, per).to(device=b.dev, dtype=torch.int32)


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
        table = _tables(b, num_pages, bsz, ctx)
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
        table = _tables(b, num_pages, 1, ctx)
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

    for t in s.gdn_tokens:
        q, k, v, g, beta = gdn_inputs(t)
        slots = torch.tensor([0], device=dev)
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        per_tok = 2 * 64 * (3 * s.dk + 2 * s.dv) + 6 * s.dk * s.dv
        nbytes = t * (2 * s.hk * s.dk + 2 * s.hv * s.dv) * 2 + 2 * t * s.hv * (s.dk + s.dv) * 4

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
        table = _tables(b, num_pages, bsz, ctx)
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
        table = _tables(b, num_pages, 1, ctx)
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
    b = Bench(rep, shapes, device, deadline)
    for part in (bench_attention, bench_linear):
        try:
            part(b, head)
        except Exception as exc:  # report and go on: one broken op must not hide the others
            rep.fail(f"bench {part.__name__}: {type(exc).__name__}: {exc}")
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if b.skipped:
        rep.say(f"bench: {b.skipped} cases skipped past the {BUDGET_S['bench']:.0f} s deadline")
    hq = Bench(rep, shapes, device, time.monotonic() + BUDGET_S["hq"])
    try:
        bench_hq(hq, head)
    except Exception as exc:
        rep.fail(f"bench bench_hq: {type(exc).__name__}: {exc}")
    if hq.skipped:
        rep.say(f"hq: {hq.skipped} cases skipped past the {BUDGET_S['hq']:.0f} s deadline")


# ----- compile-only pre-flight ----------------------------------------------
SM90_SHARED = 232448  # bytes of shared memory one block may use on H100/H200
TL_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            torch.int16: "i16", torch.int32: "i32", torch.int64: "i64"}


def _kernels() -> list:
    from ignis.kernels.causal_conv import triton_conv
    from ignis.kernels.gated_delta_rule import triton_chunk, triton_recurrent
    from ignis.kernels.hq_e8 import triton_decode as hq_decode
    from ignis.kernels.hq_e8 import triton_prefill as hq_prefill
    from ignis.kernels.hq_e8 import triton_write as hq_write
    from ignis.kernels.paged_attention import triton_decode, triton_prefill, triton_write

    return [triton_write._write_kv_kernel, triton_prefill._prefill_kernel, triton_decode._decode_split_kernel,
            triton_decode._decode_reduce_kernel, triton_chunk._chunk_wy_kernel, triton_chunk._chunk_fwd_kernel,
            triton_recurrent._recurrent_kernel, triton_conv._conv_varlen_kernel, triton_conv._conv_update_kernel,
            hq_write._quantize_kernel, hq_write._window_write_kernel, hq_decode._decode_split_kernel,
            hq_prefill._prefill_kernel]


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
    triton_decode.decode_attention(e(bsz, s.hq, s.d), kc, vc, table, lens, 0.1)
    g, slots = e(n, s.hv, dt=torch.float32), e(bsz, dt=torch.int64)
    q, v, beta, pool = e(n, s.hk, s.dk), e(n, s.hv, s.dv), e(n, s.hv), e(bsz, s.hv, s.dk, s.dv, dt=torch.float32)
    triton_chunk.chunk_gated_delta_rule(q, q, v, g, beta, pool, slots[:1], cu)
    triton_recurrent.recurrent_gated_delta_rule(q[:bsz], q[:bsz], v[:bsz], g[:bsz], beta[:bsz], pool, slots)
    x, w, conv_pool = e(n, s.conv_dim), e(s.conv_dim, s.taps), e(bsz, s.conv_dim, s.taps - 1)
    triton_conv.causal_conv1d_varlen(x, w, conv_pool, slots[:1], cu)
    triton_conv.causal_conv1d_update(x[:bsz], w, conv_pool, slots)
    _launch_hq(s, dtype, e, n, ctx, bsz, cu, table, lens)


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
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

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
    target, seen, ok = GPUTarget("cuda", 90, 32), set(), 0
    for fn, args, kwargs in captured:
        sig, consts, attrs, options = _signature(fn, args, dict(kwargs))
        key = (fn.__name__, repr(sorted(sig.items())), repr(sorted(map(str, consts.items()))), repr(options))
        if key in seen:
            continue
        seen.add(key)
        what = fn.__name__ + " " + " ".join(f"{k}={v}" for k, v in consts.items() if k.isupper())
        try:
            compiled = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target,
                                      options=options)
        except Exception as exc:
            rep.fail(f"compile {what}: {type(exc).__name__}: {str(exc)[-600:]}")
            continue
        shared = compiled.metadata.shared
        rep.say(f"compile {what} {options}: shared {shared} B")
        if shared > SM90_SHARED:
            rep.fail(f"compile {what}: {shared} B of shared memory exceeds {SM90_SHARED}")
        else:
            ok += 1
    return ok


# ----- driver ---------------------------------------------------------------
def run_tiers(rep: Report, device: str, head: dict) -> None:
    """Section 5: bench/gpu_tiers.py in its own processes, its figures into the table and ``head``."""
    argv = [sys.executable, str(ROOT / "bench" / "gpu_tiers.py")] + (["--dry-run"] if device == "cpu" else [])
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=BUDGET_S["tiers"] + 60)
    except subprocess.TimeoutExpired:
        rep.fail(f"tiers: bench/gpu_tiers.py ran past {BUDGET_S['tiers'] + 60:.0f} s")
        return
    lines = proc.stdout.strip().splitlines()
    for line in lines:
        rep.say(f"tiers: {line}")
    last = lines[-1] if lines else ""
    if proc.returncode != 0 or not last.startswith("BENCH gpu_tiers ok=1 "):
        rep.fail(f"tiers: exit {proc.returncode}: {proc.stderr[-1500:]}")
    fields = dict(kv.split("=", 1) for kv in last.split()[2:] if "=" in kv)
    head["tiers_ok"] = fields.get("ok", "0")
    for key in ("gather_gbps", "scatter_gbps"):
        if key in fields:
            head[f"tiers_{key}"] = fields[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", "--quick", action="store_true", dest="dry_run",
                        help="CPU, TRITON_INTERPRET=1, tiny shapes (checks the script itself)")
    parser.add_argument("--compile-only", action="store_true",
                        help="no GPU needed: compile every kernel launch for sm_90 and check its shared memory")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu_check.txt",
                        help="where the table is written")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.compile_only:
        rep = Report()
        ok = run_compile_only(rep)
        print(f"BENCH gpu_check compiled={ok} compile_failed={len(rep.failures)} "
              f"wall_s={time.monotonic() - t0:.0f}", flush=True)
        return 0 if not rep.failures else 1
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU machine)", file=sys.stderr)
        return 2
    shapes = DRY if args.dry_run else FULL
    rep = Report()
    import triton

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    rep.say(f"gpu_check on {name}: torch {torch.__version__}, triton {triton.__version__}")
    passed, failed = run_tests(rep, device, BUDGET_S["tests"])
    model_err = float("nan")
    try:
        model_err = run_model(rep, shapes, device, time.monotonic() + BUDGET_S["model"])
    except Exception as exc:
        rep.fail(f"model: {type(exc).__name__}: {exc}")
    head: dict[str, str] = {}
    run_bench(rep, shapes, device, time.monotonic() + BUDGET_S["bench"], head)
    run_tiers(rep, device, head)
    wall = time.monotonic() - t0
    rep.say(f"failures: {len(rep.failures)}; wall {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(rep.lines) + "\n")
    if os.environ.get("OUT"):
        shutil.copy(args.out, Path(os.environ["OUT"]) / args.out.name)
    fields = [f"kernels_passed={passed}", f"kernels_failed={failed}", f"model_max_rel_err={model_err:.2e}"]
    fields += [f"{k}={head[k]}" for k in ("decode_attn_64k_gbps", "decode_attn_b64_gbps", "prefill_attn_tflops",
                                          "gdn_chunk_ms", "gdn_recurrent_gbps", "conv_varlen_gbps",
                                          "hq_decode_b1_gbps", "hq_decode_b64_gbps", "hq_prefill_tflops",
                                          "tiers_ok", "tiers_gather_gbps", "tiers_scatter_gbps")
               if k in head]
    fields += [f"failures={len(rep.failures)}", f"wall_s={wall:.0f}"]
    print("BENCH gpu_check " + " ".join(fields), flush=True)
    return 0 if not rep.failures and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
