"""Images in reuse keys (engine.reuse.image_keys), end to end on the demo model with stand-in images.

No vision tower is needed: an "image" here is a run of one token id placed
with a made-up digest, which is all reuse reads. The same digest in a later
turn is matched past the image; another digest of the same size misses from
the image on; a capture point inside an image walks back to before it; a
resumed request's logits equal a cold prefill's.
"""

from __future__ import annotations

import hashlib

import pytest

from ignis.engine.request import Request, capture_cuts
from ignis.engine.reuse.hashing import page_chain
from ignis.engine.reuse.image_keys import KEY_BASE, ImageKey, key_ids, key_tokens, walk_back, walk_back_all
from ignis.shared.sampling import SamplingParams
from tests.engine.test_reuse import TOL, Engine, model, prompt, rel  # noqa: F401 (model: a fixture)

PAD = 77


def digest(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=16).digest()


def test_key_ids_carry_the_whole_digest_above_every_vocabulary():
    a, b = digest("a"), digest("b")
    ids = key_ids(a, 12)
    assert all(KEY_BASE <= t < 1 << 31 for t in ids)
    assert ids[:5] == ids[5:10]  # five chunks, repeated
    rebuilt = sum((t - KEY_BASE) << (30 * i) for i, t in enumerate(ids[:5]))
    assert rebuilt == int.from_bytes(a, "little")
    assert key_ids(a, 6) != key_ids(b, 6)
    flipped = bytearray(a)
    flipped[15] ^= 0x80  # the last bit: only the fifth chunk holds it
    assert key_ids(bytes(flipped), 5) != key_ids(a, 5)


def test_key_tokens_replace_only_the_image_runs():
    tokens = tuple(range(10))
    keys = (ImageKey(2, 5, digest("a")), ImageKey(7, 9, digest("b")))
    out = key_tokens(tokens, keys)
    assert out[:2] == (0, 1) and out[5:7] == (5, 6) and out[9] == 9
    assert out[2:5] == tuple(key_ids(digest("a"), 3)) and out[7:9] == tuple(key_ids(digest("b"), 2))
    assert key_tokens(tokens[:4], keys) == out[:4]  # a prefix's keys are the prefix of the keys
    assert key_tokens(tokens, ()) == tokens


def test_page_hashes_fold_the_image_in():
    tokens = [1] * 100 + [PAD] * 100 + [2] * 56
    same = key_tokens(tokens, (ImageKey(100, 200, digest("a")),))
    again = key_tokens(list(tokens), (ImageKey(100, 200, digest("a")),))
    other = key_tokens(tokens, (ImageKey(100, 200, digest("b")),))
    ha, hb, hc = page_chain(same, 64), page_chain(again, 64), page_chain(other, 64)
    assert ha == hb
    assert ha[1] == hc[1] and ha[2] != hc[2]  # page 1 (64..127) holds the image's first tokens
    assert page_chain(tokens, 64)[2] not in (ha[2], hc[2])


def test_a_system_block_ending_inside_an_image_loses_its_mark():
    req = Request("r", tuple(range(300)), SamplingParams(), system_end=200, opener_start=290,
                  must_cut_at=capture_cuts(300, 200, 290, 64))
    req.place_images((ImageKey(100, 250, digest("a")),), 64)
    assert req.system_end is None and req.must_cut_at == (100, 290)


def test_walk_back():
    keys = (ImageKey(10, 20, digest("a")), ImageKey(30, 40, digest("b")))
    assert [walk_back(c, keys) for c in (5, 10, 15, 20, 25, 39, 40)] == [5, 10, 10, 20, 25, 30, 40]
    assert walk_back_all((15, 35, 50, 5), keys) == (5, 10, 30, 50)
    assert walk_back_all((3,), (ImageKey(0, 8, digest("a")),)) == ()


def _submit(eng: Engine, rid: str, tokens: list[int], images: dict[int, tuple[int, str]], *,
            system_end=None, opener_start=None, part_end=None) -> Request:
    """Submit ``tokens`` whose images are ``{start: (length, name)}``."""
    req = Request(rid, tuple(tokens), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                  system_end=system_end, opener_start=opener_start, part_end=part_end, last_is_user=True,
                  must_cut_at=capture_cuts(len(tokens), system_end, opener_start, 64, part_end))
    req.place_images(tuple(ImageKey(s, s + n, digest(name)) for s, (n, name) in sorted(images.items())), 64)
    assert eng.sched.add(req) is None
    return req


SYSTEM = prompt(150, 11)
BEFORE = prompt(30, 12)  # the first user turn's text before its image
IMAGE_AT, IMAGE_LEN = 180, 90  # tokens 180 .. 269
AFTER = prompt(25, 13)


def _turn1() -> list[int]:
    return SYSTEM + BEFORE + [PAD] * IMAGE_LEN + AFTER  # the opener starts at 295


def test_the_same_image_is_matched_in_later_turns_and_another_misses_from_it(model):
    eng = Engine(model)
    t1 = _turn1()
    _submit(eng, "t1", t1 + [5, 6], {IMAGE_AT: (IMAGE_LEN, "cat")}, system_end=150, opener_start=len(t1))
    eng.run()
    t2 = t1 + [5, 6] + prompt(20, 14)
    _submit(eng, "t2", t2 + [5, 6], {IMAGE_AT: (IMAGE_LEN, "cat")}, system_end=150, opener_start=len(t2))
    eng.run()
    assert eng.finished["t2"].cached_tokens == len(t1) > IMAGE_AT + IMAGE_LEN
    t3 = t2 + [5, 6] + prompt(20, 15)
    _submit(eng, "t3", t3 + [5, 6], {IMAGE_AT: (IMAGE_LEN, "cat")}, system_end=150, opener_start=len(t3))
    eng.run()
    assert eng.finished["t3"].cached_tokens == len(t2)
    # the same tokens with another picture of the same size: only the system block before the image is reused
    _submit(eng, "swap", t3 + [5, 6], {IMAGE_AT: (IMAGE_LEN, "dog")}, system_end=150, opener_start=len(t3))
    eng.run()
    assert eng.finished["swap"].cached_tokens == 128 and eng.finished["swap"].reuse_kind == "retained_prefix"
    cold = Engine(model, reuse=False)
    cold.submit("t3", t3 + [5, 6], max_tokens=4)
    cold.run()
    assert rel(eng.first_logits["t3"], cold.first_logits["t3"]) < TOL
    assert eng.tokens["t3"] == cold.tokens["t3"] == eng.tokens["swap"]  # the stand-in images are the same tokens
    eng.check_drained()


def test_a_capture_point_inside_an_image_walks_back_before_it(model):
    eng = Engine(model)
    t1 = _turn1()
    req = _submit(eng, "a", t1 + [5, 6], {IMAGE_AT: (IMAGE_LEN, "cat")}, system_end=150, opener_start=len(t1),
                  part_end=IMAGE_AT + 40)
    assert IMAGE_AT in req.must_cut_at and IMAGE_AT + 40 not in req.must_cut_at
    eng.run()
    assert sorted(e.num_tokens for e in eng.sched.store.entries()) == [128, IMAGE_AT, len(t1)]
    # a prompt that shares the image but goes on differently: it resumes before the image at most
    other = t1[:IMAGE_AT] + [PAD] * IMAGE_LEN + prompt(25, 16)
    _submit(eng, "b", other + [5], {IMAGE_AT: (IMAGE_LEN, "dog")}, opener_start=len(other))
    eng.run()
    assert eng.finished["b"].cached_tokens == IMAGE_AT
    eng.check_drained()


def test_a_learned_point_inside_an_image_walks_back_before_it(model):
    eng = Engine(model)
    head = prompt(100, 21)
    first = head + [PAD] * 200 + prompt(30, 22)  # the image takes 100 .. 299
    _submit(eng, "first", first, {100: (200, "cat")}, opener_start=len(first) - 2)
    eng.run()
    second = head + [PAD] * 200 + prompt(30, 23)  # shares 4 whole pages (256 tokens): inside the image
    req = _submit(eng, "second", second, {100: (200, "cat")}, opener_start=len(second) - 2)
    assert req.shared_tokens == 100  # what it shares ends where a resume could: before the image
    assert req.learned_at == 100 and 256 not in req.must_cut_at
    eng.run()
    eng.check_drained()


@pytest.mark.parametrize("cut", [IMAGE_AT + 1, IMAGE_AT + IMAGE_LEN - 1])
def test_cuts_from_marks_are_moved_when_images_are_placed(cut):
    req = Request("r", tuple(_turn1()), SamplingParams(), system_end=150, part_end=cut, opener_start=295,
                  must_cut_at=capture_cuts(300, 150, 295, 64, cut))
    req.place_images((ImageKey(IMAGE_AT, IMAGE_AT + IMAGE_LEN, digest("cat")),), 64)
    assert req.must_cut_at == (128, IMAGE_AT, 295) and req.part_end == IMAGE_AT and req.system_end == 150
    assert req.key_prefix(IMAGE_AT + 2)[-2:] == tuple(key_ids(digest("cat"), 2))
    assert req.key_prefix(IMAGE_AT) == tuple(_turn1()[:IMAGE_AT])


def _waiting(rid: str, tokens: list[int], image: str, arrival: int) -> Request:
    req = Request(rid, tuple(tokens), SamplingParams(max_tokens=2))
    req.place_images((ImageKey(IMAGE_AT, IMAGE_AT + IMAGE_LEN, digest(image)),), 64)
    req.arrival = arrival
    return req


def test_a_burst_shares_a_point_only_where_its_images_are_the_same():
    from collections import deque

    from ignis.engine.burst_points import capture_ahead, share_ahead

    tokens = _turn1() + prompt(40, 31)
    point = len(_turn1())  # past the image
    ahead_dog = _waiting("dog", tokens, "dog", 0)
    ahead_cat = _waiting("cat", tokens, "cat", 1)
    late = _waiting("late", tokens, "cat", 2)
    waiting = {"interactive": deque([ahead_dog, ahead_cat])}
    assert share_ahead(point, late, waiting, ()) is ahead_cat  # the earlier one has another picture
    assert point in ahead_cat.must_cut_at and point not in ahead_dog.must_cut_at
    assert share_ahead(IMAGE_AT + 10, late, {"interactive": deque([ahead_dog])}, ()) is None  # inside its image
    from ignis.engine.request import RequestState

    ahead_cat.state = RequestState.PREFILLING
    kind = lambda other, p: "learned_point"  # noqa: E731
    assert capture_ahead(late.key_prefix(len(tokens)), 0, [ahead_cat], kind)
    assert not capture_ahead(_waiting("x", tokens, "dog", 3).key_prefix(len(tokens)), 0, [ahead_cat], kind)
