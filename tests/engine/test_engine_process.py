"""The real engine process, driven through its ZeroMQ interface on the demo model."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest
import torch
import zmq

from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE, added_token_id
from ignis.shared.image_input import ImageInput
from ignis.shared.wire import ENGINE_TO_GATEWAY, ErrorReply, Generate, SamplingParams, decode, encode
from tests.engine.engine_process import EngineProcess

def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(TOKENIZER_SIZE) for _ in range(n)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = EngineProcess(tmp_path_factory.mktemp("rt"), "--decode-lanes", "16", "--kv-pool-tokens", "16384",
                        "--max-prefill-tokens-per-round", "512")
    yield eng
    assert eng.stop() == 0


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """transformers' greedy search (forward with its cache, argmax over the tokenizer's ids)."""
    out = []
    with torch.no_grad():
        res = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            logits = res.logits[0, -1, :TOKENIZER_SIZE]  # embedding rows past it are never sampled
            tok = int(torch.argmax(logits))
            out.append(tok)
            res = model(torch.tensor([[tok]]), cache=res.cache, use_cache=True)
    return out


def test_sixteen_concurrent_greedy_match_alone_and_transformers(engine, hf_model):
    lengths = [5, 17, 64, 65, 130, 200, 250, 31, 90, 199, 3, 129, 300, 44, 7, 260]
    prompts = {f"c{i}": prompt(n, i) for i, n in enumerate(lengths)}
    for rid, p in prompts.items():
        engine.generate(rid, p, max_tokens=12, ignore_eos=True)
    together = engine.wait(list(prompts))
    for rid, p in prompts.items():
        assert together[rid].finished.finish_reason == "length"
        assert len(together[rid].tokens) == 12
    for rid in ("c5", "c12", "c10"):  # a few alone, including the longest (> 3 pages)
        alone = engine.run(rid + "-alone", prompts[rid], max_tokens=12, ignore_eos=True)
        assert alone.tokens == together[rid].tokens
    for rid, p in prompts.items():
        assert together[rid].tokens == hf_greedy(hf_model, p, 12), rid
    engine.wait_pool_full()


def test_seeded_sampling_reproducible_and_batch_independent(engine):
    p = prompt(40, 99)
    kw = dict(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    first = engine.run("s1", p, **kw).tokens
    second = engine.run("s2", p, **kw).tokens
    assert first == second
    for i in range(5):
        engine.generate(f"noise{i}", prompt(30 + 20 * i, i), temperature=1.0, max_tokens=20, ignore_eos=True)
    engine.generate("s3", p, **kw)
    outs = engine.wait(["s3"] + [f"noise{i}" for i in range(5)])
    assert outs["s3"].tokens == first
    other_seed = engine.run("s4", p, **{**kw, "seed": 4321}).tokens
    assert other_seed != first


def test_abort_mid_prefill_and_mid_decode_frees_pool(engine):
    engine.generate("long", prompt(3000, 5), max_tokens=4)  # 6 prefill rounds at 512 per round
    engine.abort("long")
    out = engine.wait(["long"])["long"]
    assert out.finished.finish_reason == "abort"
    engine.wait_pool_full()

    engine.generate("dec", prompt(100, 6), max_tokens=5000, ignore_eos=True)
    deadline = time.monotonic() + 60
    while engine.outcomes["dec"].batches < 3 and time.monotonic() < deadline:
        engine.pump()
    engine.abort("dec")
    out = engine.wait(["dec"])["dec"]
    assert out.finished.finish_reason == "abort"
    assert 3 <= len(out.tokens) < 5000
    engine.wait_pool_full()

    # the gateway's stop-string end: the same teardown, finished (and counted) as a stop
    engine.generate("stopped", prompt(100, 7), max_tokens=5000, ignore_eos=True)
    deadline = time.monotonic() + 60
    while engine.outcomes["stopped"].batches < 2 and time.monotonic() < deadline:
        engine.pump()
    engine.abort("stopped", reason="stop")
    assert engine.wait(["stopped"])["stopped"].finished.finish_reason == "stop"
    engine.wait_pool_full()


def test_refusals_have_reasons(engine):
    out = engine.run("too-long", prompt(16384, 1), max_tokens=4)
    assert out.refused is not None and out.refused.reason == "too_long"
    out = engine.run("bad-token", [5, 999999], max_tokens=4)
    assert out.refused is not None and out.refused.reason == "bad_request"
    out = engine.run("served", prompt(10, 2), max_tokens=2)
    assert out.finished is not None


def test_a_grammar_is_refused_when_it_does_not_compile_and_held_to_when_it_does(engine):
    out = engine.run("bad-grammar", prompt(10, 4), max_tokens=8, grammar="start: missing_rule")
    assert out.refused is not None and out.refused.reason == "bad_request"
    assert "grammar does not compile" in out.refused.message and "missing_rule" in out.refused.message
    grammar = '{"grammars": [{"json_schema": {"enum": ["yes", "no"]}}]}'
    out = engine.run("held", prompt(10, 5), max_tokens=20, temperature=1.0, seed=3, grammar=grammar)
    assert out.finished.finish_reason == "stop"
    assert out.tokens[-1] in (added_token_id("<|im_end|>"), added_token_id("<|endoftext|>"))  # the demo's EOS ids


def test_images_for_a_text_only_model_are_refused(engine):
    picture = ImageInput.from_rgb(bytes(range(48)), 4, 4)
    out = engine.run("pictured", prompt(10, 6), max_tokens=2, images=(picture,))
    assert out.refused is not None and out.refused.reason == "bad_request"
    assert "takes no images" in out.refused.message
    assert engine.run("after-picture", prompt(10, 7), max_tokens=2).finished is not None


def test_garbage_on_the_socket_gets_error_reply_and_next_request_served(engine):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(engine.endpoint)
    try:
        for frames in ([b"garbage"], [b'{"type": "generate", "v": 1}'], [b"{}", b"\x01\x02\x03"],
                       [b'{"type": "nope", "v": 1}'], [b'{"type": "stats", "v": 999}'], _bad_image_frames()):
            sock.send_multipart(frames)
            assert sock.poll(5000), f"no reply to {frames!r}"
            reply = decode(sock.recv_multipart(), accept=ENGINE_TO_GATEWAY)
            assert isinstance(reply, ErrorReply) and reply.message
    finally:
        sock.close()
    out = engine.run("after-garbage", prompt(20, 3), max_tokens=3)
    assert out.finished.finish_reason == "length"
    assert engine.stats()["wire_errors"] >= 6


def _bad_image_frames() -> list[bytes]:
    """A Generate whose image frame holds other bytes than its digest names."""
    frames = encode(Generate("garbage-image", (1, 2), SamplingParams(),
                             images=(ImageInput.from_rgb(bytes(12), 2, 2),)))
    frames[2] = bytes([1]) * 12
    return frames


def test_small_pool_queues_requests_and_all_complete(tmp_path):
    eng = EngineProcess(tmp_path, "--decode-lanes", "4", "--kv-pool-tokens", "512")
    try:
        rids = [f"q{i}" for i in range(6)]
        for i, rid in enumerate(rids):
            eng.generate(rid, prompt(150, 40 + i), max_tokens=20, ignore_eos=True)
        outs = eng.wait(rids)
        for rid in rids:
            assert outs[rid].finished.finish_reason == "length", outs[rid]
            assert len(outs[rid].tokens) == 20
        alone = eng.run("q0-alone", prompt(150, 40), max_tokens=20, ignore_eos=True)
        assert alone.tokens == outs["q0"].tokens
        eng.wait_pool_full()
    finally:
        assert eng.stop() == 0


def test_queue_limit_and_sigterm_drain(tmp_path):
    eng = EngineProcess(tmp_path, "--decode-lanes", "1", "--max-queue", "1", "--shutdown-timeout", "5")
    try:
        for i in range(3):
            eng.generate(f"m{i}", prompt(20, i), max_tokens=200, ignore_eos=True)
        outs = eng.wait([f"m{i}" for i in range(3)])
        reasons = [o.refused.reason for o in outs.values() if o.refused is not None]
        assert "queue_full" in reasons
        eng.generate("inflight", prompt(20, 7), max_tokens=100000, ignore_eos=True)
        while eng.outcomes["inflight"].batches < 1:
            eng.pump()
    finally:
        t0 = time.monotonic()
        rc = eng.stop(timeout=30)
    assert rc == 0
    assert time.monotonic() - t0 < 20


def test_reuse_reports_cached_tokens_through_the_wire(engine):
    p = prompt(230, 77)
    first = engine.run("reuse-1", p, max_tokens=4, system_end=150, opener_start=227)
    again = engine.run("reuse-2", p, max_tokens=4, system_end=150, opener_start=227)
    assert first.finished.usage.cached_tokens == 0
    assert again.finished.usage.cached_tokens == 227
    assert (again.finished.reuse.kind, again.finished.reuse.tier) == ("prompt_checkpoint", "device")
    assert again.tokens == first.tokens
    sibling = engine.run("reuse-3", p[:150] + prompt(30, 78), max_tokens=4, system_end=150, opener_start=177)
    assert sibling.finished.usage.cached_tokens == 128
    assert sibling.finished.reuse.kind == "retained_prefix"
    stats = engine.stats()
    assert stats["retained_entries"] >= 2


def test_stats_are_answered_while_a_long_round_runs(tmp_path):
    from ignis.shared.wire import Stats, StatsReply, TokenBatch

    eng = EngineProcess(tmp_path, "--decode-lanes", "2", "--kv-pool-tokens", "16384",
                        "--max-prefill-tokens-per-round", "16384")
    try:
        eng.generate("long", prompt(12000, 3), max_tokens=1)
        time.sleep(0.3)  # the round (one 12K-token prefill) is running now
        eng.client.send(Stats())
        order = []
        deadline = time.monotonic() + 120
        while len(order) < 2 and time.monotonic() < deadline:
            env = eng.client.get(timeout=120)
            if isinstance(env.message, StatsReply):
                order.append("stats")
                assert env.message.models == ("ignis-demo",)  # what it serves, for a gateway to compare
            elif isinstance(env.message, TokenBatch):
                order.append("token")
        assert order[0] == "stats", order
    finally:
        assert eng.stop() == 0


def test_a_metrics_port_in_use_is_a_one_line_start_error(tmp_path):
    """docs/operations.md: a metrics port in use fails the start with exit code 2 and one line (as tierd)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        outs = {role: subprocess.run([sys.executable, "-m", "ignis.launcher.cli", role, "--runtime-dir", str(tmp_path),
                                      "--metrics-port", str(port), *extra], capture_output=True, text=True, timeout=300)
                for role, extra in (("engine", ()), ("tierd", ("--reuse-kv-host-pool-bytes", "16M")))}
    for role, out in outs.items():
        assert out.returncode == 2, out.stderr[-3000:]
        assert f"ignis {role}: cannot serve metrics on 127.0.0.1:{port}" in out.stderr
        assert "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.sock"))  # each had bound its socket: gone with it


def test_a_runtime_dir_that_cannot_be_made_is_a_one_line_start_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "engine", "--runtime-dir",
                          str(tmp_path / "missing" / "rt")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "ignis engine: cannot create runtime dir" in out.stderr and "Traceback" not in out.stderr


def test_an_engine_serving_more_models_than_a_stats_reply_names_still_answers_stats(tmp_path):
    """65 models: the reply carries no names (a gateway then does not compare them); it was refused by the
    wire, and the engine answered no Stats at all."""
    from ignis.shared.wire import Stats, StatsReply

    demo = str(ensure_demo_model())
    names = [f"--model=m{i}={demo}" for i in range(StatsReply.MAX_MODELS + 1)]
    eng = EngineProcess(tmp_path, "--kv-pool-tokens", "4096", "--decode-lanes", "2", *names)
    try:
        eng.client.send(Stats())
        deadline = time.monotonic() + 30
        while True:
            env = eng.client.get(timeout=30)
            if isinstance(env.message, StatsReply):
                break
            assert time.monotonic() < deadline
        assert env.message.models == () and env.message.values["model_loaded"] == 1
    finally:
        assert eng.stop() == 0
