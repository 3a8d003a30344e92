"""Grammar-constrained sampling in the runner: masks, matchers, the cache, and lanes left free.

A random model of the demo's shape speaks the demo tokenizer's byte-level
vocabulary (Qwen3.5's: 248,320 embedding rows; rows past the tokenizer's
248,077 ids are padding). Requests
run through the scheduler and runner as the engine runs them; a constrained
request's text must parse under its schema and end with the model's EOS.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ignis.engine.grammar_cache import GrammarCache, GrammarError
from ignis.engine.grammar_lanes import GrammarLanes
from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.gateway.grammars import json_schema_grammar
from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.builder import model_config
from ignis.shared.demo.tokenizer import VOCABULARY, added_token_id
from ignis.shared.sampling import SamplingParams
from ignis.shared.tokenizer_files import read_tokenizer_files, tokenizer_vocab_size

VOCAB = VOCABULARY.config_vocab_size
EOS = added_token_id("<|im_end|>")
PAD = added_token_id("<|endoftext|>")
LANES, PAGES = 6, 48
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"}}, "required": ["name", "n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def demo_dir():
    return ensure_demo_model()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HybridModel(config_from_dict(model_config(VOCAB, eos_id=EOS, pad_id=PAD))).eval()


@pytest.fixture(scope="module")
def tokenizer(demo_dir):
    return load_tokenizer(demo_dir, VOCAB, (EOS,))


def serve(model, demo_dir, cache, requests) -> dict[str, list[int]]:
    """Run ``requests`` ([(id, prompt, SamplingParams, grammar or None)]) to the end; each one's output ids."""
    sched = Scheduler(SchedulerConfig(decode_lanes=LANES, num_pages=PAGES, max_model_len=PAGES * 64,
                                      max_prefill_tokens_per_round=512, eos_token_ids=(EOS,)), reuse=False)
    state = ModelState.allocate(model.cfg, num_pages=PAGES, lanes=LANES, dtype=torch.float32)
    runner = ModelRunner(model, state, vocab_limit=tokenizer_vocab_size(demo_dir), grammars=GrammarLanes(cache))
    for rid, prompt, params, grammar in requests:
        if grammar is not None:
            assert runner.grammars.constrain(rid, grammar) is None
        assert sched.add(Request(rid, tuple(prompt), params)) is None
    out: dict[str, list[int]] = {}
    for _ in range(2000):
        plan = sched.schedule()
        if plan.is_empty:
            if not sched.has_work:
                return out
            continue
        result, _ = runner.run(plan)
        for rid, tok in result.tokens.items():
            out.setdefault(rid, []).append(tok)
        for ev in sched.update(result):
            runner.release(ev.req_id)
    raise AssertionError("the requests did not finish")


def text_of(tokenizer, ids: list[int]) -> str:
    assert ids[-1] == EOS, "a complete grammar ends with the end-of-sequence token"
    return tokenizer.decode_str(ids[:-1])


def test_constrained_lanes_parse_and_free_lanes_get_the_tokens_they_get_alone(model, demo_dir, tokenizer):
    cache = GrammarCache(lambda: tokenizer)
    grammar = json_schema_grammar(SCHEMA)
    free = [(f"free{i}", [5 + i, 40, 41, 42], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), None)
            for i in range(3)]
    constrained = [(f"json{i}", [9, 10 + i, 11], SamplingParams(temperature=t, seed=i, max_tokens=60), grammar)
                   for i, t in enumerate((0.0, 1.0, 1.0))]
    mixed = serve(model, demo_dir, cache, free + constrained)
    alone = serve(model, demo_dir, cache, free)
    for rid, *_ in free:
        assert mixed[rid] == alone[rid]
    import jsonschema
    for rid, *_ in constrained:
        jsonschema.validate(json.loads(text_of(tokenizer, mixed[rid])), SCHEMA)
    assert cache.compiles == 1  # one schema, three requests: compiled once


def test_top_k_top_p_and_penalties_respect_the_mask(model, demo_dir, tokenizer):
    cache = GrammarCache(lambda: tokenizer)
    grammar = json_schema_grammar({"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3})
    settings = [SamplingParams(temperature=1.5, top_k=5, seed=1, max_tokens=40),
                SamplingParams(temperature=1.0, top_p=0.5, seed=2, max_tokens=40),
                SamplingParams(temperature=0.7, min_p=0.1, repetition_penalty=1.3, presence_penalty=1.0, seed=3,
                               max_tokens=40)]
    out = serve(model, demo_dir, cache, [(f"r{i}", [3, 4, 5], p, grammar) for i, p in enumerate(settings)])
    for i in range(len(settings)):
        value = json.loads(text_of(tokenizer, out[f"r{i}"]))
        assert isinstance(value, list) and len(value) <= 3 and set(value) <= {"red", "green"}


@pytest.mark.parametrize("overlap", [False, True], ids=["in-place", "worker"])
def test_masks_disallow_exactly_what_the_matcher_disallows_and_skip_free_rows(tokenizer, overlap):
    import llguidance

    cache = GrammarCache(lambda: tokenizer)
    lanes = GrammarLanes(cache, overlap=overlap)
    assert lanes.constrain("a", json_schema_grammar({"type": "boolean"})) is None
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    rnd = lanes.begin(["free", "a", "other"])
    assert rnd.rows == [1]
    lanes.apply(logits, rnd)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    reference = llguidance.LLMatcher(tokenizer, json_schema_grammar({"type": "boolean"}))
    bits = np.unpackbits(np.frombuffer(reference.compute_bitmask(), dtype=np.uint8), bitorder="little")[:VOCAB]
    allowed = torch.from_numpy(bits.astype(bool))
    assert torch.equal(torch.isfinite(logits[1]), allowed)
    assert torch.equal(logits[1][allowed], before[1][allowed])
    assert lanes.begin(["free", "other"]) is None  # no constrained row: nothing filled


def test_a_matcher_follows_its_tokens_and_a_complete_grammar_allows_only_eos(tokenizer):
    lanes = GrammarLanes(GrammarCache(lambda: tokenizer))
    lanes.constrain("a", json_schema_grammar({"const": "yes"}))
    for tok in tokenizer.tokenize_str('"yes"'):
        rnd = lanes.begin(["a"])
        logits = torch.zeros(1, VOCAB)
        lanes.apply(logits, rnd)
        assert torch.isfinite(logits[0, tok])
        lanes.advance(rnd, [tok])
    rnd = lanes.begin(["a"])
    logits = torch.zeros(1, VOCAB)
    lanes.apply(logits, rnd)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    lanes.release("a")
    assert lanes.begin(["a"]) is None


def test_the_cache_compiles_once_per_text_evicts_the_oldest_and_refuses_bad_grammars(tokenizer):
    cache = GrammarCache(lambda: tokenizer, size=2)
    g = [json_schema_grammar({"type": t}) for t in ("integer", "boolean", "null")]
    cache.matcher(g[0])
    cache.matcher(g[1])
    cache.matcher(g[0])  # g[0] is now the most recent
    assert cache.compiles == 2
    cache.matcher(g[2])
    assert g[0] in cache and g[1] not in cache and len(cache) == 2
    with pytest.raises(GrammarError, match="Invalid type"):
        cache.matcher(json_schema_grammar({"type": "nope"}))
    assert len(cache) == 2
    lanes = GrammarLanes(cache)
    assert "Invalid type" in lanes.constrain("x", json_schema_grammar({"type": "nope"}))
    assert "x" not in lanes.matchers


def test_token_bytes_come_from_the_byte_level_vocabulary(tokenizer):
    ids = tokenizer.tokenize_str('{"a": 1}')
    assert tokenizer.decode_bytes(ids) == b'{"a": 1}'
    assert tokenizer.vocab_size == VOCAB and tokenizer.eos_tokens == [EOS]


def test_token_bytes_decode_every_byte_level_piece_and_refuse_other_characters(tmp_path, demo_dir):
    from ignis.engine.grammar_tokenizer import token_bytes
    from ignis.shared.tokenizer_files import TokenizerFilesError, bytes_to_unicode, read_json_object

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    real = read_tokenizer_files(demo_dir).tokenizer_json
    tokens, special = token_bytes(real, VOCAB)
    for piece, i in read_json_object(real)["model"]["vocab"].items():  # one character at a time, as spelled
        assert tokens[i] == bytes(byte_of[c] for c in piece), (i, piece)
    assert EOS in special and tokens[EOS] == b"<|im_end|>" and tokens[VOCAB - 1] == b""
    alphabet = "".join(bytes_to_unicode().values())  # all 256 bytes, in one piece
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"model": {"type": "BPE", "vocab": {alphabet: 0, "\u0120hi": 1}}}))
    assert token_bytes(ok, 2)[0] == [bytes(byte_of[c] for c in alphabet), b" hi"]
    for bad in ("a\x05", "\u4e2d", "\u00ad"):  # a control character, CJK, a soft hyphen: none is byte-level
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"ok": 0, bad: 1}}}))
        with pytest.raises(TokenizerFilesError, match="token 1 is not byte-level BPE"):
            token_bytes(path, 2)


def test_the_host_and_device_forms_of_apply_set_the_same_entries_to_minus_inf(tokenizer):
    from ignis.engine.grammar_masks import GrammarMasks, fill_disallowed

    masks = GrammarMasks(GrammarCache(lambda: tokenizer))
    gen = torch.Generator().manual_seed(3)
    words = masks.words
    buf = torch.randint(-2**31, 2**31 - 1, (4, words), dtype=torch.int32, generator=gen)
    buf[2] = 0  # nothing allowed but what the bits say: here nothing
    logits = torch.randn(4, VOCAB, generator=gen)
    logits[1, 7] = float("-inf")
    logits[3, 9] = -0.0
    host, device = logits.clone(), logits.clone()
    masks.apply_numpy(host, buf, [0, 1, 2], VOCAB - 5)
    masks.apply_torch(device, buf, [0, 1, 2], VOCAB - 5)
    assert torch.equal(host, device)
    assert torch.equal(host[3], logits[3]) and torch.equal(host[:3, VOCAB - 5:], logits[:3, VOCAB - 5:])
    bits = np.unpackbits(buf[0].numpy().view(np.uint8), bitorder="little")[:VOCAB - 5].astype(bool)
    assert torch.equal(torch.isfinite(host[0, :VOCAB - 5]), torch.from_numpy(bits))
    assert torch.isinf(host[2, :VOCAB - 5]).all()

    row = np.array([1.5, -2.0, -0.0, np.inf, -np.inf, 3.0], dtype=np.float32)
    fill_disallowed(row, np.array([0, 1, 0, 1, 1, 0], dtype=np.uint8))
    assert row.tolist() == [1.5, -np.inf, 0.0, -np.inf, -np.inf, 3.0] and np.signbit(row[2])


def test_logprobs_are_those_of_the_masked_distribution(model, demo_dir, tokenizer):
    import math

    sched = Scheduler(SchedulerConfig(decode_lanes=2, num_pages=8, max_model_len=512,
                                      max_prefill_tokens_per_round=512, eos_token_ids=(EOS,)), reuse=False)
    runner = ModelRunner(model, ModelState.allocate(model.cfg, num_pages=8, lanes=2, dtype=torch.float32),
                         vocab_limit=tokenizer_vocab_size(demo_dir), grammars=GrammarLanes(GrammarCache(lambda: tokenizer)))
    runner.grammars.constrain("a", json_schema_grammar({"enum": ["yes", "no"]}))
    sched.add(Request("a", (5, 6, 7), SamplingParams(temperature=1.0, seed=0, logprobs=True, top_logprobs=20)))
    result, logprobs = runner.run(sched.schedule())
    lp = logprobs["a"]
    allowed = torch.isfinite(runner.last_logits["a"]).nonzero().flatten().tolist()
    assert 0 < len(allowed) < 20  # a quote, or a quote and the start of a value
    assert sorted(t for t, _ in lp.top) == allowed
    assert math.isclose(sum(math.exp(v) for _, v in lp.top), 1.0, rel_tol=1e-5)
    assert result.tokens["a"] in allowed and lp.token_logprob == dict(lp.top)[result.tokens["a"]]


def test_a_vocabulary_that_cannot_take_grammars_refuses_them_without_raising_anything_else(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}')
    built = []
    lanes = GrammarLanes(GrammarCache(lambda: built.append(1) or load_tokenizer(tmp_path, 8, (1,))))
    error = lanes.constrain("a", json_schema_grammar({"type": "boolean"}))
    assert "cannot take grammars" in error and "BPE" in error
    assert lanes.begin(["a"]) is None
    assert lanes.constrain("b", json_schema_grammar({"type": "string"})) == error  # said again, not built again
    assert built == [1]
