"""Every Triton kernel variant a served workload launches is one the runner's warm-up already compiled.

Triton compiles a kernel once per *specialisation* of its arguments: each
integer is classed as 1 (made a constant), a multiple of 16 or other, and
each pointer as 16-byte aligned or not. On a GPU each new class a round meets
is a compile of seconds on the serving loop (the first burst after a start ran
at 54 tokens/s against 1,015 once compiled). Here the kernels are not run:
their launches under the interpreter are recorded with Triton's own
specialisation of every argument (its ``do_not_specialize`` lists honoured)
while the engine's warm-up runs, then while a varied workload is served in
process (chunked prompts of many lengths beside decoding lanes, one to eight
lanes, prompt scoring, speculative rounds with a drafter, prompts that keep
state images inside their chunks and resume from them, hq-e8-2b pages, the
Qwen3-Next family). Every key of the
workload must be one of the warm-up's. A launch zeroes its floating-point
tensors instead of running, so outputs are zeros and nothing is NaN: the
bookkeeping runs on, and the shapes are what is checked.
"""

from __future__ import annotations

import inspect
import random
from collections import defaultdict

import pytest
import torch

from ignis.engine.models.build import drafter_from_checkpoint, load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request, capture_cuts
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.engine.spec_decode import SpecDecoder
from ignis.kernels.backend import triton_ops
from ignis.shared.sampling import SamplingParams
from tests.engine.checkpoints import make_checkpoint


class LaunchRecorder:
    """Records each kernel launch's specialisation key under the current ``phase`` instead of running it."""

    def __init__(self):
        self.phase = "warm-up"
        self.keys: dict[tuple[str, str], set] = defaultdict(set)

    def key(self, kernel, args: tuple, kwargs: dict) -> tuple:
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import native_specialize_impl

        params = list(inspect.signature(kernel.fn).parameters.values())
        plain = set(kernel.kwargs.get("do_not_specialize") or ())
        any_alignment = set(kernel.kwargs.get("do_not_specialize_on_alignment") or ())
        values = dict(zip((p.name for p in params), args)) | kwargs
        key = []
        for p in params:
            value = values.get(p.name, p.default)
            if "constexpr" in str(p.annotation):
                key.append((p.name, "constexpr", value))
            else:
                key.append((p.name, *native_specialize_impl(BaseBackend, value, False, p.name not in plain,
                                                             p.name not in any_alignment)))
        return tuple(key)

    def install(self, monkeypatch) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        def run(kernel, *args, grid, warmup, **kwargs):
            self.keys[(self.phase, kernel.fn.__name__)].add(self.key(kernel, args, kwargs))
            for value in (*args, *kwargs.values()):  # outputs (and inputs) zero, never a NaN from empty memory
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    value.zero_()

        monkeypatch.setattr(InterpretedFunction, "run", run)

    def unseen(self, phase: str) -> list[str]:
        """Each kernel variant ``phase`` launched that the warm-up did not, with the arguments that differ
        from the warm-up's nearest variant."""
        out = []
        for (ph, name), keys in sorted(self.keys.items()):
            if ph != phase:
                continue
            warm = self.keys.get(("warm-up", name), set())
            for key in keys - warm:
                nearest = min(([(a, b) for a, b in zip(key, w) if a != b] for w in warm), key=len, default=key)
                out.append(f"{name}: {nearest}")
        return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A checkpoint with a drafter, one whose 2 kv heads of 32 make the 64 values an hq-e8-2b page codes,
    and a Qwen3-Next one."""
    root = tmp_path_factory.mktemp("variants")
    return {"default": make_checkpoint(root, "qwen3_5", mtp="full").path,
            "hq-e8-2b": make_checkpoint(root, "qwen3_5", config_overrides={"head_dim": 32}).path,
            "qwen3_next": make_checkpoint(root, "qwen3_next").path}


def serve(runner: ModelRunner, sched: Scheduler, requests: list[Request]) -> int:
    """Run ``requests`` to their end; the drafted tokens accepted."""
    for req in requests:
        assert sched.add(req) is None
    accepted = 0
    for _ in range(2000):
        if not sched.has_work:
            return accepted
        plan = sched.schedule()
        result, _ = runner.run(plan)
        if not plan.is_empty:
            accepted += sum(len(v) for v in result.extra.values())
            for ev in sched.update(result):
                runner.release(ev.req_id)
    raise AssertionError("the workload did not finish")


def varied(vocab: int, seed: int, prefix: tuple[int, ...] = (), tag: str = "r") -> list[Request]:
    """Prompts of many lengths (after ``prefix``), some scored, outputs of 1 to 20 tokens."""
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 200, 300, 7, 48]
    out = []
    for i, n in enumerate(lengths):
        prompt = prefix + tuple(rng.randrange(1, vocab - 1) for _ in range(n))
        params = SamplingParams(temperature=0.0, max_tokens=rng.choice([1, 2, 3, 9, 20]), ignore_eos=True,
                                prompt_logprobs=1 if i % 7 == 3 else None)
        if prefix:  # the prefix is a system block, the last 3 tokens an assistant opener: both capture marks
            out.append(Request(f"{tag}{i}", prompt, params, system_end=len(prefix), opener_start=len(prompt) - 3,
                               must_cut_at=capture_cuts(len(prompt), len(prefix), len(prompt) - 3, 64)))
        else:
            out.append(Request(f"{tag}{i}", prompt, params))
    return out


@pytest.mark.parametrize("mode", ["plain", "speculative", "reuse", "hq-e8-2b", "qwen3_next"])
def test_a_served_workload_meets_only_kernel_variants_the_warm_up_compiled(checkpoints, monkeypatch, mode):
    recorder = LaunchRecorder()
    recorder.install(monkeypatch)
    model, ckpt = load_model(checkpoints.get(mode, checkpoints["default"]), ops=triton_ops())
    lanes, pages, slots = 8, 160, (2, 6) if mode == "reuse" else (0, 0)
    drafts = 2 if mode == "speculative" else 0
    kv = dict(kv_format="hq-e8-2b", exact_window=32) if mode == "hq-e8-2b" else {}
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, **kv)
    state.allocate_slots(*slots)
    runner = ModelRunner(model, state)
    if drafts:
        runner.use_drafter(SpecDecoder(model, drafter_from_checkpoint(ckpt), state, drafts))
    runner.warm_up()
    assert recorder.keys, "the warm-up launched no kernel: nothing is checked"
    recorder.phase = "served"
    vocab = model.cfg.vocab_size
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                      max_prefill_tokens_per_round=160, speculative_tokens=drafts,
                                      eos_token_ids=(vocab - 1,), capture_inside_chunks=True),
                      device_slots=slots[0], host_slots=slots[1], reuse=mode == "reuse")
    if mode == "reuse":
        system = tuple(random.Random(9).randrange(1, vocab - 1) for _ in range(150))
        serve(runner, sched, varied(vocab, 1, system, "a"))
        serve(runner, sched, varied(vocab, 2, system, "b"))  # resumes the system block, then its own prompt
        stats = sched.store.stats()
        assert stats["reuse_captures_total"] > 0 and stats["reuse_hits_total"] > 0, stats
    else:
        accepted = serve(runner, sched, varied(vocab, 1))
        assert accepted > 0 if drafts else accepted == 0
    served = {name for phase, name in recorder.keys if phase == "served"}
    attention = {"_prefill_kernel", "_decode_split_kernel"}  # the hq-e8-2b forms' kernels have the same names
    assert attention | {"_chunk_out_kernel", "_conv_update_kernel"} <= served
    unseen = recorder.unseen("served")
    assert unseen == [], "\n".join(unseen)
