"""gpu_check sections ``e2e`` and ``state``: a 27B-shaped Qwen3.5 end to end, and its state images.

``e2e`` builds the model with random weights directly on the device (meta
first, then ``to_empty`` and an in-place init: no file, no host copy), prints
the memory plan the engine would make for it (weights, KV pool tokens in bf16
and hq-e8-2b), then times with CUDA synchronisation:

- prefill tokens/s of one prompt of 8K and of 32K tokens, in 8K-token chunks
  (one forward per chunk, as the engine's rounds run them), after a warm-up
  prefill that compiles every kernel;
- decode TPOT at 1 and at 32 lanes, each lane at a 4K-token context, eager
  (``ForwardBatch.build`` + forward, one host sync per step, as a round does)
  and replaying the decode CUDA graphs (``engine.decode_graphs``). The
  decode contexts are page tables over pages nobody prefilled: attention reads
  the same bytes either way. The graphs' page tables are as wide as the
  engine's would be at the model's full context (262,144 tokens).

``state`` times a lane's state image (recurrent + conv state of every linear
layer, ~148 MiB at 27B shapes) cloned into a device slot, and restored from a
pinned host slot into a lane, through ``ModelState.save_image`` /
``load_image``.

Both run at tiny shapes on the CPU in ``--dry-run`` (no graphs there: the
eager twin of the graph buffers runs instead).
"""

from __future__ import annotations

import time

import torch

from gpu_check_report import Report
from gpu_check_shapes import Shapes


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def random_model(cfg, dtype: torch.dtype, device: str):
    """A HybridModel with random weights made on ``device`` (nothing on the host)."""
    from ignis.engine.models.hybrid import HybridModel

    with torch.device("meta"):
        model = HybridModel(cfg).to(dtype)  # in the serving dtype before any byte exists
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            else:  # zero-centred norms (weight = offset from 1), A_log
                p.zero_()
    model.rotary.inv_freq = model.rotary.frequencies(device)
    return model.eval()


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def memory_plan_rows(rep: Report, cfg, model, device: str, lanes: int) -> None:
    from ignis.engine.memory_plan import plan_memory

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    free = None
    if device == "cuda":
        sync(device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        rep.say(f"e2e: weights {_gb(weights)} on the device; free after weights {_gb(free)} of {_gb(total)}")
    else:
        rep.say(f"e2e: weights {_gb(weights)}")
    for fmt, window in (("bf16", 0), ("hq-e8-2b", 64)):
        try:
            plan = plan_memory(cfg, "bfloat16", lanes, free_device_bytes=free, kv_format=fmt, exact_window=window,
                               host_slots=2 * lanes)
        except ValueError as exc:
            rep.say(f"e2e: memory plan {fmt}: {exc}")
            continue
        rep.say(f"e2e: memory plan {fmt}: {plan.tokens} KV pool tokens ({_gb(plan.pool_bytes)}), "
                f"{lanes} lanes of {plan.slot_bytes / 2**20:.0f} MiB live state")


def _prefill(model, state, ids: list[int], lane: int, first_page: int, chunk: int, device: str) -> float:
    """Seconds to prefill ``ids`` on ``lane`` in chunks of ``chunk`` tokens (pages from ``first_page``)."""
    from ignis.engine.forward_batch import ForwardBatch, SeqChunk

    pages = list(range(first_page, first_page + -(-len(ids) // 64)))
    state.reset_lane(lane)
    sync(device)
    t0 = time.perf_counter()
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        model(ForwardBatch.build([SeqChunk(part, start, pages, lane)], device), state)
    sync(device)
    return time.perf_counter() - t0


def _decode_chunks(lanes: int, context: int, first_page: int):
    from ignis.engine.forward_batch import SeqChunk

    per = -(-(context + 1) // 64)
    return [SeqChunk([11 + i], context, list(range(first_page + i * per, first_page + (i + 1) * per)), i)
            for i in range(lanes)]


def _tpot(step, steps: int) -> float:
    """Milliseconds per step of ``step()`` (each ends in a host sync), after two untimed steps."""
    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) * 1e3 / steps


def top_kernels(rep: Report, what: str, fn, device: str, rows: int = 12) -> None:
    """The kernels one call of ``fn`` runs on the device, the costliest first (torch profiler)."""
    if device != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events)
    launches = sum(e.count for e in events)
    rep.say(f"profile {what}: {launches} kernels, {total / 1e3:.2f} ms on the device")
    for e in events[:rows]:
        rep.say(f"profile {what}: {e.self_device_time_total / 1e3:8.3f} ms {100 * e.self_device_time_total / total:5.1f}%"
                f" x{e.count:<5} {e.key[:90]}")


def run_e2e(rep: Report, shapes: Shapes, device: str, deadline: float, head: dict) -> None:
    from ignis.engine.decode_graphs import DecodeGraphs
    from ignis.engine.forward_batch import ForwardBatch
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.state import ModelState

    e = shapes.e2e
    cfg = config_from_dict(e["model"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.monotonic()
    model = random_model(cfg, dtype, device)
    sync(device)
    rep.say(f"e2e: {cfg.num_layers}-layer model, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
            f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, built in "
            f"{time.monotonic() - t0:.1f} s")
    lanes = max(e["decode_lanes"])
    memory_plan_rows(rep, cfg, model, device, lanes)
    longest = max(e["prefill"])
    prefill_pages = -(-longest // 64)
    ctx = e["decode_context"]
    decode_pages = lanes * -(-(ctx + 1) // 64)
    # lanes 0..L-1 decode, lane L prefills; pages: the decode contexts, then the prompt
    state = ModelState.allocate(cfg, num_pages=decode_pages + prefill_pages, lanes=lanes + 1, dtype=dtype,
                                device=device, scratch=True)
    vocab_gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size, (longest,), generator=vocab_gen).tolist()
    chunk = e["chunk"]
    warm = _prefill(model, state, ids[:chunk], lanes, decode_pages, chunk, device)
    rep.say(f"e2e: warm-up prefill of {chunk} tokens (compiles the kernels): {warm:.1f} s")
    for key, n in zip(("prefill_8k_tok_s", "prefill_32k_tok_s"), e["prefill"]):  # named by the 27B run's sizes
        if time.monotonic() > deadline:
            rep.say(f"e2e: past the deadline, prefill {n} skipped")
            continue
        secs = _prefill(model, state, ids[:n], lanes, decode_pages, chunk, device)
        rate = n / secs
        rep.say(f"e2e: prefill {n:>6} tokens in {chunk}-token chunks: {secs * 1e3:8.1f} ms  {rate:10.0f} tokens/s")
        head[key] = f"{rate:.0f}"
    if time.monotonic() < deadline:
        top_kernels(rep, f"prefill {chunk}", lambda: _prefill(model, state, ids[:chunk], lanes, decode_pages, chunk,
                                                             device), device)
        one = _decode_chunks(1, ctx, 0)
        top_kernels(rep, "decode 1 lane", lambda: model(ForwardBatch.build(one, device), state), device)
    # the table of a graph spans the longest sequence the engine admits, as when it serves
    graphs = DecodeGraphs(model, state, torch.device(device), lanes, e["graph_max_len"], capture=device == "cuda")
    t0 = time.monotonic()
    captured = graphs.capture()
    rep.say(f"e2e: decode graphs {graphs.status} ({time.monotonic() - t0:.1f} s)")
    for name, n in zip(("1", "32"), e["decode_lanes"]):
        if time.monotonic() > deadline:
            rep.say(f"e2e: past the deadline, decode at {n} lanes skipped")
            continue
        chunks = _decode_chunks(n, ctx, 0)

        def eager(chunks=chunks):
            model(ForwardBatch.build(chunks, device), state).argmax(-1).cpu()

        def replay(chunks=chunks):
            graphs.run(chunks).argmax(-1).cpu()

        ms_eager = _tpot(eager, e["steps"])
        line = f"e2e: decode {n:>2} lanes at {ctx} context: eager {ms_eager:7.2f} ms/step"
        head[f"tpot_{name}_eager_ms"] = f"{ms_eager:.2f}"
        if captured or device != "cuda":
            ms_graph = _tpot(replay, e["steps"])
            line += f", graphs {ms_graph:7.2f} ms/step ({ms_eager / ms_graph:.1f}x)"
            head[f"tpot_{name}_ms"] = f"{ms_graph:.2f}"
        rep.say(line)
    graphs.close()


def _image_bytes(state, lane: int) -> int:
    return sum(t[:, lane].numel() * t.element_size() for t in (state.ssm, state.conv))


def _timed(fn, reps: int, device: str) -> float:
    """Milliseconds per call of ``fn`` (CUDA events on the device, wall clock on the CPU)."""
    fn()
    sync(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def run_state(rep: Report, shapes: Shapes, device: str, deadline: float, head: dict) -> None:
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.state import ModelState

    cfg = config_from_dict(shapes.e2e["model"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    state = ModelState.allocate(cfg, num_pages=4, lanes=2, dtype=dtype, device=device)
    state.allocate_slots(2, 2)  # slots 0, 1 on the device; 2, 3 pinned on the host
    state.ssm.normal_()
    state.conv.normal_()
    nbytes = _image_bytes(state, 0)
    clone = _timed(lambda: state.save_image(0, 0), 20, device)
    save_host = _timed(lambda: state.save_image(0, 2), 5, device)
    restore = _timed(lambda: state.load_image(2, 1), 5, device)
    ok = all(torch.equal(live[:, 1], live[:, 0]) for live in (state.ssm, state.conv))
    device_ok = all(torch.equal(slots[0][:, 0], live[:, 0])
                    for live, slots in ((state.ssm, state.slot_ssm), (state.conv, state.slot_conv)))
    gbs = nbytes / restore / 1e6
    rep.say(f"state: image {nbytes / 2**20:.1f} MiB: clone to a device slot {clone:.3f} ms "
            f"({2 * nbytes / clone / 1e6:.0f} GB/s read+write); save to a host slot {save_host:.2f} ms "
            f"({nbytes / save_host / 1e6:.1f} GB/s); restore from a host slot {restore:.2f} ms ({gbs:.1f} GB/s); "
            f"bytes {'ok' if ok and device_ok else 'DIFFER'}")
    if not (ok and device_ok):
        rep.fail("state: a restored image differs from the saved one")
    head["clone_ms"] = f"{clone:.3f}"
    head["restore_gbs"] = f"{gbs:.1f}"
    state.close()
