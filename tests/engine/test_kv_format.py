"""The KV format as a property of the pool: flags, memory plan, state images, stamps, end to end.

End to end on the demo model (2 full-attention layers, 2 kv heads of 32,
fp32, torch twins), hq-e8-2b with a 64-token window against bf16, measured:
KL(bf16 || hq) of the next-token distribution over a 300-token prompt's
logits 3e-5 mean / 3e-4 max; over 256 teacher-forced decode steps 3e-5
mean / 3e-4 max, where the two formats pick the same greedy token 88% of the
time. Free-running greedy decoding first differs after 13 tokens: the demo
model is random and its top two logits are often within the codec's noise.
On the first demo model (2,000-token vocabulary) the twins cost 2-2.5x bf16
on the CPU (prefill 0.09 s vs 0.036 s; decode step 7 ms vs 3 ms), which is
why bf16 is the CPU default.

Resume: a resumed hq-e8-2b request matches a cold prefill of the same prompt
as tightly as bf16 does (both quantize the same keys the same way).
"""

from __future__ import annotations

import random

import pytest
import torch

from ignis.engine.load_choices import kv_stamp, resolve_kv_format
from ignis.engine.config import EngineConfig
from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE
from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.memory_plan import kv_page_bytes, lane_bytes, plan_memory
from ignis.engine.models.build import load_model
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.state import CompressedLayer, ModelState
from tests.engine.engine_process import EngineProcess
from tests.engine.test_reuse import Engine as ReuseEngine
from tests.engine.test_reuse import prompt as prompt_of
from tests.engine.test_reuse import rel

HQ = "hq-e8-2b"
VOCAB = TOKENIZER_SIZE
WINDOW = 64


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


def tiny_cfg(head_dim=32, kv_heads=2):
    return config_from_dict({
        "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 4, "layer_types": ["linear_attention", "full_attention"] * 2,
        "num_attention_heads": 4, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "max_position_embeddings": 512})


# ----- flags, plan, state ---------------------------------------------------
def test_format_flag_and_its_default_per_device():
    assert EngineConfig().kv_format == "auto"
    assert EngineConfig().resolved_kv_format("cuda") == "bf16", "auto is exact pages everywhere (docs/gpu.md)"
    assert EngineConfig().resolved_kv_format("cpu") == "bf16"
    assert EngineConfig(kv_format=HQ).resolved_kv_format("cpu") == HQ
    assert EngineConfig(kv_format="bf16").resolved_kv_format("cuda") == "bf16"
    assert EngineConfig().kv_exact_window == WINDOW
    with pytest.raises(ValueError, match="--kv-exact-window"):
        EngineConfig(kv_exact_window=-1)


def test_memory_plan_per_format():
    cfg = tiny_cfg()
    # 2 full layers x (K, V) x 64 rows x (64/8 codes + 64/64 scale) x 2 bytes
    assert kv_page_bytes(cfg, "float32", HQ) == 2 * 2 * 64 * 9 * 2
    assert kv_page_bytes(cfg, "float32", "bf16") == 2 * 2 * 64 * 64 * 4
    window = 2 * 2 * WINDOW * 64 * 4
    assert lane_bytes(cfg, "float32", HQ, WINDOW) == lane_bytes(cfg, "float32") + window
    plan = plan_memory(cfg, "float32", 4, kv_pool_tokens=640, kv_format=HQ, exact_window=WINDOW, host_slots=3)
    assert plan.pages == 10 and plan.pool_bytes == 10 * kv_page_bytes(cfg, "float32", HQ)
    assert plan.slot_bytes == lane_bytes(cfg, "float32", HQ, WINDOW)
    assert HQ in plan.describe()


def test_compressed_state_layout_images_and_pages():
    cfg = tiny_cfg()
    st = ModelState.allocate(cfg, num_pages=6, lanes=3, dtype=torch.float32, kv_format=HQ, exact_window=8)
    assert st.kv_format == HQ and st.num_pages == 6
    assert st.pages.shape == (2, 2, 6, 64, 9) and st.pages.dtype == torch.int16
    assert st.window.shape == (2, 3, 2, 8, 2, 32)
    assert isinstance(st.kv[1], CompressedLayer) and st.kv[1].window.shape == (3, 2, 8, 2, 32)
    st.allocate_slots(device_slots=1, host_slots=2)
    st.window[:, 2] = torch.randn(st.window[:, 2].shape)
    saved = st.window[:, 2].clone()
    st.ssm[:, 2] = 1.5
    st.save_image(2, 2)  # global slot 2 = host slot 1
    st.window[:, 2] = 0.0
    st.load_image(2, 0)
    assert torch.equal(st.window[:, 0], saved) and bool((st.ssm[:, 0] == 1.5).all())
    assert torch.equal(st.slot_window[1][:, 1], saved), "loading leaves the slot as it was"
    st.copy_lane(0, 1)
    assert torch.equal(st.window[:, 1], st.window[:, 0])
    st.pages[:, :, 4] = torch.randint(-3000, 3000, st.pages[:, :, 4].shape, dtype=torch.int16)
    st.copy_page(4, 5)
    assert torch.equal(st.pages[:, :, 5], st.pages[:, :, 4])
    bf = ModelState.allocate(cfg, num_pages=6, lanes=3, dtype=torch.float32)
    assert bf.kv_format == "bf16" and bf.window is None and bf.pages is bf.kv


def test_head_shapes_the_format_refuses():
    with pytest.raises(ValueError, match="kv-format"):
        ModelState.allocate(tiny_cfg(head_dim=16), num_pages=2, lanes=1, dtype=torch.float32, kv_format=HQ,
                            exact_window=4)


def test_auto_is_bf16_and_an_explicit_hq_checks_the_heads():
    narrow = tiny_cfg(head_dim=16)
    for device in ("cpu", "cuda"):
        assert resolve_kv_format(EngineConfig(), device, narrow) == "bf16"
        assert resolve_kv_format(EngineConfig(), device, tiny_cfg()) == "bf16"
        assert resolve_kv_format(EngineConfig(kv_format=HQ), device, tiny_cfg()) == HQ
    with pytest.raises(ValueError, match="kv-format"):
        resolve_kv_format(EngineConfig(kv_format=HQ), "cpu", narrow)



def test_stamp_names_format_and_window():
    stamps = {kv_stamp("bf16", 0), kv_stamp(HQ, 64), kv_stamp(HQ, 32)}
    assert len(stamps) == 3 and kv_stamp("bf16", 0) == "bf16"


# ----- end to end -----------------------------------------------------------
def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    p = torch.log_softmax(p_logits[..., :VOCAB].double(), -1)
    q = torch.log_softmax(q_logits[..., :VOCAB].double(), -1)
    return (p.exp() * (p - q)).sum(-1)


def generate(model, fmt, prompt, steps, teacher=None):
    """Prefill then ``steps`` greedy decode steps; returns (prompt logits, tokens, decode logits)."""
    state = ModelState.allocate(model.cfg, num_pages=16, lanes=2, dtype=torch.float32, fill=float("nan"),
                                kv_format=fmt, exact_window=WINDOW)
    state.reset_lane(1)
    pages = list(range(16))[::-1]
    first = model(ForwardBatch.build([SeqChunk(prompt, 0, pages, 1)]), state, all_logits=True)
    tok, pos, tokens, rows = int(first[-1, :VOCAB].argmax()), len(prompt), [], [first[-1]]
    for i in range(steps):
        tokens.append(tok)
        feed = teacher[i] if teacher is not None else tok
        row = model(ForwardBatch.build([SeqChunk([feed], pos, pages, 1)]), state)[0]
        rows.append(row)
        tok, pos = int(row[:VOCAB].argmax()), pos + 1
    return first, tokens, torch.stack(rows)


def test_end_to_end_against_bf16(model):
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(300)]
    steps = 128
    ref_first, ref_tokens, ref_rows = generate(model, "bf16", prompt, steps)
    hq_first, hq_tokens, _ = generate(model, HQ, prompt, steps)
    _, _, forced_rows = generate(model, HQ, prompt, steps, teacher=ref_tokens)
    assert bool(torch.isfinite(hq_first).all())
    prefill_kl, decode_kl = kl(ref_first, hq_first), kl(ref_rows, forced_rows)
    same = float((ref_rows[:, :VOCAB].argmax(-1) == forced_rows[:, :VOCAB].argmax(-1)).float().mean())
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_tokens, hq_tokens)) if a != b), steps)
    print(f"KL(bf16 || hq-e8-2b): prompt logits mean {prefill_kl.mean():.2e} max {prefill_kl.max():.2e}; "
          f"{steps} teacher-forced steps mean {decode_kl.mean():.2e} max {decode_kl.max():.2e}; "
          f"same greedy token {same:.1%}; free-running greedy first differs at token {first_diff}")
    assert float(prefill_kl.mean()) < 1e-3 and float(prefill_kl.max()) < 1e-2
    assert float(decode_kl.mean()) < 1e-3 and float(decode_kl.max()) < 2e-2
    assert same > 0.8
    # the prompt's newest WINDOW positions read exact keys: the last prompt logits are closer than average
    assert float(prefill_kl[-1]) < 1e-2


# ----- resume, per format ---------------------------------------------------
def Engine(model, fmt, reuse=True, stamp=None):
    """tests/engine/test_reuse.py's in-process loop, with the pool's format as a parameter."""
    return ReuseEngine(model, reuse=reuse, kv_format=fmt, exact_window=WINDOW,
                       stamp=stamp or f"demo:{kv_stamp(fmt, WINDOW)}:drafter=0")


@pytest.mark.parametrize("fmt", ["bf16", HQ])
def test_checkpoint_resume_matches_cold_prefill(model, fmt):
    p = prompt_of(203, 1)
    eng = Engine(model, fmt)
    eng.submit("a", p, system_end=130, opener_start=200)
    eng.run()
    eng.submit("retry", p, system_end=130, opener_start=200)
    eng.run()
    ev = eng.finished["retry"]
    assert (ev.cached_tokens, ev.reuse_kind) == (200, "prompt_checkpoint")
    cold = Engine(model, fmt, reuse=False)
    cold.submit("cold", p)
    cold.run()
    err = rel(eng.first_logits["retry"], cold.first_logits["cold"])
    print(f"{fmt}: resumed vs cold rel err {err:.2e}")
    assert err < 1e-5
    assert eng.tokens["retry"] == cold.tokens["cold"] == eng.tokens["a"]
    eng.check_drained()


@pytest.mark.parametrize("fmt", ["bf16", HQ])
def test_retained_prefix_serves_a_sibling(model, fmt):
    system = prompt_of(150, 2)
    eng = Engine(model, fmt)
    eng.submit("first", system + prompt_of(60, 3), system_end=150, opener_start=207)
    eng.run()
    sib = system + prompt_of(40, 4)
    eng.submit("sibling", sib, system_end=150, opener_start=187)
    eng.run()
    assert (eng.finished["sibling"].cached_tokens, eng.finished["sibling"].reuse_kind) == (128, "retained_prefix")
    cold = Engine(model, fmt, reuse=False)
    cold.submit("sibling", sib)
    cold.run()
    assert rel(eng.first_logits["sibling"], cold.first_logits["sibling"]) < 1e-5
    assert eng.tokens["sibling"] == cold.tokens["sibling"]
    eng.check_drained()


def test_entry_of_another_format_is_never_resumed(model):
    """An entry stamped bf16 in a store that now serves hq-e8-2b is refused before any byte moves."""
    p = prompt_of(203, 5)
    eng = Engine(model, HQ, stamp=f"demo:{kv_stamp('bf16', 0)}:drafter=0")
    eng.submit("a", p, opener_start=200)
    eng.run()
    assert len(eng.sched.store) == 1
    eng.sched.store.stamp = f"demo:{kv_stamp(HQ, WINDOW)}:drafter=0"
    eng.submit("b", p, opener_start=200)
    eng.run()
    assert eng.finished["b"].cached_tokens == 0
    assert eng.sched.store.stamp_refusals >= 1
    eng.check_drained()


def test_engine_process_serves_hq(tmp_path):
    """``ignis engine --kv-format hq-e8-2b`` on the CPU: batched equals alone, the pool drains, reuse hits."""
    eng = EngineProcess(tmp_path, "--kv-format", HQ, "--kv-exact-window", "32", "--decode-lanes", "4",
                        "--kv-pool-tokens", "4096")
    try:
        rids = [f"h{i}" for i in range(3)]
        for i, rid in enumerate(rids):
            eng.generate(rid, prompt_of(120 + 10 * i, 60 + i), max_tokens=12, ignore_eos=True)
        outs = eng.wait(rids)
        for rid in rids:
            assert outs[rid].finished.finish_reason == "length" and len(outs[rid].tokens) == 12
        alone = eng.run("h0-alone", prompt_of(120, 60), max_tokens=12, ignore_eos=True)
        assert alone.tokens == outs["h0"].tokens
        eng.wait_pool_full()
        p = prompt_of(230, 61)
        first = eng.run("r1", p, max_tokens=4, system_end=150, opener_start=227)
        again = eng.run("r2", p, max_tokens=4, system_end=150, opener_start=227)
        assert again.finished.usage.cached_tokens == 227 and again.tokens == first.tokens
        assert f"{HQ}, float32" in eng.log_path.read_text()  # the plan line, however long the log grew
    finally:
        assert eng.stop() == 0
