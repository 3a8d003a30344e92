"""A cache salt in reuse keys (engine.reuse.salt_keys): salted prompts reuse only under their own salt.

Unit cases on the key map, then the engine loop on the demo model: a salted
conversation resumes under its salt with the output of a cold run, and
neither another salt nor no salt resumes from its state (nor it from theirs),
whether the state is a checkpoint, a retained prefix or a point a burst
shares.
"""

from __future__ import annotations

import hashlib
from collections import deque

import pytest

from ignis.engine.burst_points import capture_ahead, share_ahead
from ignis.engine.request import Request, RequestState
from ignis.engine.reuse.block_events import BlockLedger, BlockStored
from ignis.engine.reuse.image_keys import KEY_BASE, ImageKey, key_ids
from ignis.engine.reuse.salt_keys import (
    MAX_SALTED_TOKEN,
    SALT_BITS,
    SALT_POSITIONS,
    raw_token,
    salt_chunks,
    salted,
    salted_image_digest,
)
from ignis.shared.sampling import SamplingParams
from tests.engine.test_reuse import TOL, Engine, model, prompt, rel  # noqa: F401 (model: a fixture)

A = hashlib.sha256(b"tenant a").hexdigest()
B = hashlib.sha256(b"tenant b").hexdigest()


def test_salt_chunks_are_fixed_per_salt_and_differ_between_salts():
    a, b = salt_chunks(A), salt_chunks(B)
    assert a == salt_chunks(A) and len(a) == SALT_POSITIONS
    assert all(0 <= c < 1 << SALT_BITS for c in a + b)
    assert a != b


def test_salted_keys_keep_prefixes_and_tokens_and_never_equal_unsalted_ones():
    chunks = salt_chunks(A)
    tokens = tuple(range(100, 140))
    keys = salted(tokens, chunks)
    assert len(keys) == len(tokens)
    assert all(k < 0 for k in keys[:SALT_POSITIONS]) and keys[SALT_POSITIONS:] == tokens[SALT_POSITIONS:]
    assert salted(tokens[:10], chunks) == keys[:10]  # a prefix's keys are the prefix of the keys
    assert tuple(raw_token(k) for k in keys) == tokens
    # one to one under one salt: tokens that differ anywhere give keys that differ there
    for j in (0, 5, SALT_POSITIONS - 1, SALT_POSITIONS + 3):
        other = tokens[:j] + (tokens[j] + 1,) + tokens[j + 1:]
        assert salted(other, chunks)[:j] == keys[:j] and salted(other, chunks)[j] != keys[j]
    assert salted(tokens, salt_chunks(B))[:2] != keys[:2]
    assert raw_token(MAX_SALTED_TOKEN) == MAX_SALTED_TOKEN
    assert salted((MAX_SALTED_TOKEN, 0), chunks)[0] < 0
    with pytest.raises(ValueError):
        salted((MAX_SALTED_TOKEN + 1,), chunks)  # too large to salt (and no image key id)
    with pytest.raises(ValueError):
        salted(keys, chunks)  # salted twice


def test_image_key_ids_stay_and_a_salted_requests_images_take_the_salt():
    digest = hashlib.blake2b(b"cat", digest_size=16).digest()
    chunks = salt_chunks(A)
    keys = (1, 2) + tuple(key_ids(digest, 5)) + (3,)
    out = salted(keys, chunks)
    assert out[2:7] == keys[2:7] and all(k < 0 for k in out[:2] + out[7:])
    assert salted_image_digest(A, digest) != salted_image_digest(B, digest) != digest
    req = Request("r", (1, 2) + (77,) * 5 + (3,), SamplingParams(), cache_salt=A)
    req.place_images((ImageKey(2, 7, digest),), 64)
    assert req.key_prefix(8)[2:7] == tuple(key_ids(salted_image_digest(A, digest), 5))
    assert all(k >= KEY_BASE for k in req.key_prefix(8)[2:7])


def test_a_salted_requests_key_prefix_is_salted_and_its_output_too():
    tokens = tuple(prompt(40, 1))
    plain = Request("p", tokens, SamplingParams())
    salted_req = Request("s", tokens, SamplingParams(), cache_salt=A)
    assert plain.key_prefix(40) == tokens
    assert salted_req.key_prefix(40) == salted(tokens, salt_chunks(A))
    salted_req.output_ids = [5, 6]
    assert salted_req.key_prefix(42) == salted(tokens + (5, 6), salt_chunks(A))
    with pytest.raises(ValueError):
        Request("e", tokens, SamplingParams(), cache_salt="")


def test_block_events_give_a_salted_blocks_tokens_as_tokens_and_its_hash_salted():
    events = []
    ledger = BlockLedger(64, events.append)
    tokens = tuple(prompt(64, 2))
    ledger.held(salted(tokens, salt_chunks(A)), "GPU")
    ledger.held(tokens, "GPU")
    a, plain = events
    assert isinstance(a, BlockStored) and a.token_ids == plain.token_ids == tokens
    assert a.block_hashes != plain.block_hashes


SYSTEM = prompt(150, 11)


def _turn(seed: int) -> list[int]:
    return SYSTEM + prompt(40, seed)


def test_a_salted_conversation_resumes_under_its_salt_only(model):
    eng = Engine(model)
    t1 = _turn(12)
    eng.submit("a1", t1 + [5, 6], system_end=150, opener_start=len(t1), salt=A)
    eng.run()
    assert eng.finished["a1"].cached_tokens == 0
    t2 = t1 + [5, 6] + eng.tokens["a1"] + prompt(20, 13)
    for rid, salt in (("none", None), ("b", B), ("a2", A)):
        eng.submit(rid, t2 + [5, 6], system_end=150, opener_start=len(t2), salt=salt)
        eng.run(logprobs=True)
    # another salt or none resumes nothing of the salted conversation (not even its system block)
    assert eng.finished["none"].cached_tokens == 0 and eng.finished["b"].cached_tokens == 0
    assert eng.finished["a2"].cached_tokens == len(t1) and eng.finished["a2"].reuse_kind == "prompt_checkpoint"
    cold = Engine(model, reuse=False)
    cold.submit("a2", t2 + [5, 6])
    cold.run(logprobs=True)
    assert eng.tokens["a2"] == cold.tokens["a2"] == eng.tokens["none"] == eng.tokens["b"]
    assert rel(eng.first_logits["a2"], cold.first_logits["a2"]) < TOL
    assert max(abs(x - y) for x, y in zip(eng.logprobs["a2"], cold.logprobs["a2"])) < 1e-4
    eng.check_drained()


def test_an_unsalted_prefix_is_not_reused_by_a_salted_request_nor_a_salted_one_by_another_salt(model):
    eng = Engine(model)
    eng.submit("plain", _turn(21) + [5, 6], system_end=150, opener_start=len(_turn(21)))
    eng.run()
    eng.submit("a", _turn(22) + [5, 6], system_end=150, opener_start=len(_turn(22)), salt=A)
    eng.run()
    assert eng.finished["a"].cached_tokens == 0  # the plain request's retained system block is not its
    eng.submit("b", _turn(23) + [5, 6], system_end=150, opener_start=len(_turn(23)), salt=B)
    eng.submit("a-again", _turn(24) + [5, 6], system_end=150, opener_start=len(_turn(24)), salt=A)
    eng.submit("plain-again", _turn(25) + [5, 6], system_end=150, opener_start=len(_turn(25)))
    eng.run()
    assert eng.finished["b"].cached_tokens == 0
    for rid in ("a-again", "plain-again"):  # each finds the system block its own salt (or none) retained
        assert eng.finished[rid].cached_tokens == 128 and eng.finished[rid].reuse_kind == "retained_prefix"
    eng.check_drained()


def test_a_burst_shares_capture_points_only_within_a_salt():
    tokens = tuple(prompt(300, 31))
    point = 200

    def waiting(rid, salt, arrival):
        req = Request(rid, tokens, SamplingParams(max_tokens=2), cache_salt=salt)
        req.arrival = arrival
        return req

    ahead_b, ahead_a, ahead_plain = waiting("b", B, 0), waiting("a", A, 1), waiting("plain", None, 2)
    late = waiting("late", A, 3)
    queue = {"interactive": deque([ahead_b, ahead_plain, ahead_a])}
    assert share_ahead(point, late, queue, ()) is ahead_a
    assert point in ahead_a.must_cut_at and point not in ahead_b.must_cut_at + ahead_plain.must_cut_at
    kind = lambda other, p: "learned_point"  # noqa: E731
    for req in (ahead_a, ahead_b, ahead_plain):
        req.state = RequestState.PREFILLING
    assert capture_ahead(late.key_prefix(300), 0, [ahead_a], kind)
    assert not capture_ahead(late.key_prefix(300), 0, [ahead_b, ahead_plain], kind)
    assert not capture_ahead(waiting("x", None, 4).key_prefix(300), 0, [ahead_a], kind)
