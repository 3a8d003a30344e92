"""Prompts with images through the engine loop: greedy tokens and logits equal transformers' generate.

A tiny random Qwen3_5ForConditionalGeneration (vision tower, mRoPE over every
section); pictures resized as transformers' processor resizes them; prompts
of 1 and 3 images of different sizes, prefilled whole or in chunks whose
boundaries fall inside images; decode steps after the images; a preempted
request that recomputes; and the encoder cache across requests.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request
from ignis.engine.runner import ModelRunner
from ignis.engine.scheduler import Scheduler
from ignis.engine.scheduler_config import SchedulerConfig
from ignis.shared.image_input import ImageInput
from ignis.shared.sampling import SamplingParams
from tests.engine.models.vision_reference import picture, resized_input, vlm_checkpoint
from tests.support.image_prompts import hf_greedy, pad_runs

START, PAD, END = 122, 120, 123
MAX_TOKENS = 6
TOL = 1e-5


class ImageEngine:
    """Schedule, run, update until every request ends (no sockets), for a model with a vision tower."""

    def __init__(self, model, budget: int = 4096, pages: int = 16, lanes: int = 2, cache_bytes: int = 1 << 20,
                 reuse: bool = False, dtype: torch.dtype = torch.float32):
        vcfg = _resize_config(model)
        self.sched = Scheduler(SchedulerConfig(
            decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64, max_prefill_tokens_per_round=budget,
            image_token_id=vcfg.image_token_id, image_factor=vcfg.patch_size * vcfg.spatial_merge_size),
            host_slots=4 if reuse else 0, reuse=reuse)
        state = ModelState.allocate(model.cfg, num_pages=pages, lanes=lanes, dtype=dtype, fill=float("nan"))
        state.allocate_slots(0, 4 if reuse else 0)
        self.runner = ModelRunner(model, state, image_cache_bytes=cache_bytes)
        self.tokens: dict[str, list[int]] = {}
        self.first_logits: dict[str, torch.Tensor] = {}
        self.chunk_ends: list[int] = []
        self.preempted: list[str] = []
        self.finished = {}
        self.mixed_rounds = 0  # rounds with decode steps and prefill chunks together

    def submit(self, rid: str, prompt: list[int], images: list[ImageInput], max_tokens: int = MAX_TOKENS,
               opener_start: int | None = None, cache_salt: str | None = None):
        req = Request(rid, tuple(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                      images=tuple(images), opener_start=opener_start,
                      must_cut_at=(opener_start,) if opener_start else (), cache_salt=cache_salt)
        return self.sched.add(req)

    def run(self, preempt_after: int | None = None):
        for step in range(10_000):
            plan = self.sched.schedule()
            if plan.is_empty:
                if not self.sched.has_work:
                    return
                continue
            self.chunk_ends += [c.end for c in plan.prefills]
            self.mixed_rounds += bool(plan.decodes and plan.prefills)
            result, _ = self.runner.run(plan)
            for rid, row in self.runner.last_logits.items():
                self.first_logits.setdefault(rid, row.clone())
            for rid, tok in result.tokens.items():
                self.tokens.setdefault(rid, []).append(tok)
            for ev in self.sched.update(result):
                self.finished[ev.req_id] = ev
                self.runner.release(ev.req_id)
            if preempt_after is not None and step == preempt_after:
                from ignis.engine.preemption import preempt

                victim = self.sched.running()[0]
                assert victim.output_ids, "preempted while decoding"
                preempt(self.sched, victim)
                self.preempted.append(victim.req_id)
        raise AssertionError("engine did not drain")


@pytest.fixture(scope="module")
def vlm(checkpoint_factory):
    ckpt = vlm_checkpoint(checkpoint_factory)
    model, loaded = load_model(ckpt.path)
    return ckpt, model


def _prompt(images: list[ImageInput], factor: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(0, 110, (n,), generator=g).tolist()  # noqa: E731
    ids = text(5)
    for im in images:
        ids += [START] + [PAD] * ((im.height // factor) * (im.width // factor)) + [END] + text(4)
    return ids


def _image_prompt(vcfg, sizes, seed: int, first_picture_seed: int = 0):
    """Pictures of ``sizes`` (height, width), their resized inputs, and a prompt holding them:
    -> (pictures, images, prompt)."""
    pictures = [picture(h, w, seed=first_picture_seed + i) for i, (h, w) in enumerate(sizes)]
    images = [resized_input(vcfg, p) for p in pictures]
    return pictures, images, _prompt(images, vcfg.patch_size * vcfg.spatial_merge_size, seed=seed)


def _resize_config(model):
    """The model's vision config with small pixel bounds: prompts of tens of image tokens keep tests fast."""
    return dataclasses.replace(model.vision.cfg, min_pixels=8 * 8, max_pixels=40 * 40)


_REFERENCES: dict = {}


def _reference(ckpt, vcfg, prompt, pictures):
    key = (tuple(prompt), tuple(p.tobytes() for p in pictures))
    if key not in _REFERENCES:
        _REFERENCES[key] = _generate(ckpt, vcfg, prompt, pictures)
    return _REFERENCES[key]


def _generate(ckpt, vcfg, prompt, pictures):
    out, feats = hf_greedy(ckpt.model, vcfg, prompt, pictures, PAD, MAX_TOKENS,
                           output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), out.logits[0][0], feats


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


SETS = {"one": [(20, 30)], "three": [(50, 41), (17, 64), (30, 30)]}


@pytest.mark.parametrize("name,budget", [("one", 4096), ("three", 4096), ("three", 13)])
def test_greedy_equals_transformers(vlm, name, budget):
    ckpt, model = vlm
    vcfg = _resize_config(model)
    pictures, images, prompt = _image_prompt(vcfg, SETS[name], seed=len(SETS[name]))
    want_tokens, want_logits, feats = _reference(ckpt, vcfg, prompt, pictures)
    from ignis.engine.models.image_patches import patchify

    ours = torch.cat([patchify(im, vcfg)[0] for im in images])
    assert torch.equal(ours, feats["pixel_values"].float())
    eng = ImageEngine(model, budget=budget)
    assert eng.submit("r", prompt, images) is None
    eng.run()
    assert eng.tokens["r"] == want_tokens
    assert _rel(eng.first_logits["r"], want_logits) < TOL
    if budget < 4096:  # chunk boundaries fell inside every image
        spans = pad_runs(prompt, PAD)
        assert all(any(s < e < s + n for e in eng.chunk_ends) for s, n in spans), (spans, eng.chunk_ends)
    assert eng.runner.images.encoded == len(images)  # once each, however the prefill was split


def test_bf16_model_with_images_runs_near_fp32(vlm):
    """The checkpoint loaded in bf16 (as on the GPU): image prompts whole and in 13-token chunks give the
    same first logits within 2e-2 of each other (measured 4e-3) and stay within 5e-2 of transformers' fp32
    (measured 6e-3)."""
    ckpt, _ = vlm
    model, _ = load_model(ckpt.path, dtype="bfloat16")
    vcfg = _resize_config(model)
    pictures, images, prompt = _image_prompt(vcfg, SETS["three"], seed=3)
    _, want_logits, _ = _reference(ckpt, vcfg, prompt, pictures)
    firsts = []
    for budget in (4096, 13):
        eng = ImageEngine(model, budget=budget, dtype=torch.bfloat16)
        assert eng.submit("r", prompt, images) is None
        eng.run()
        assert len(eng.tokens["r"]) == MAX_TOKENS and eng.runner.images.encoded == len(images)
        firsts.append(eng.first_logits["r"].float())
    assert bool(torch.isfinite(firsts[0]).all())
    assert _rel(firsts[1], firsts[0]) < 2e-2
    assert _rel(firsts[0], want_logits) < 5e-2


def test_repeated_image_hits_the_encoder_cache_and_preemption_keeps_positions(vlm):
    ckpt, model = vlm
    vcfg = _resize_config(model)
    pictures, images, prompt = _image_prompt(vcfg, [(40, 24)], seed=9, first_picture_seed=7)
    want_tokens, want_logits, _ = _reference(ckpt, vcfg, prompt, pictures)
    eng = ImageEngine(model, budget=16)
    eng.submit("a", prompt, images)
    eng.run()
    eng.submit("b", prompt, images)
    eng.run(preempt_after=len(prompt) // 16 + 3)  # preempted while decoding: recomputes prompt + output
    assert eng.sched.num_preemptions == 1 and eng.preempted == ["b"]
    assert eng.tokens["a"] == want_tokens and eng.tokens["b"] == want_tokens
    assert eng.runner.images.encoded == 1 and eng.runner.images.cache.hits >= 1


def test_the_encoder_cache_is_kept_apart_by_cache_salt(vlm):
    """A salted tenant never hits another scope's embedding (a fast answer would tell it the picture was
    sent); within one salt, and among unsalted requests, the picture is encoded once. Answers equal."""
    ckpt, model = vlm
    vcfg = _resize_config(model)
    pictures, images, prompt = _image_prompt(vcfg, [(40, 24)], seed=9, first_picture_seed=7)
    want_tokens, _, _ = _reference(ckpt, vcfg, prompt, pictures)
    eng = ImageEngine(model, budget=4096)
    for rid, salt, encoded in [("victim", "tenant-a", 1), ("again", "tenant-a", 1), ("other", "tenant-b", 2),
                               ("plain", None, 3), ("plain-again", None, 3)]:
        eng.submit(rid, prompt, images, cache_salt=salt)
        eng.run()
        assert eng.runner.images.encoded == encoded, rid
        assert eng.tokens[rid] == want_tokens, rid


def test_images_that_do_not_match_the_prompt_are_refused(vlm):
    _, model = vlm
    vcfg = _resize_config(model)
    image = resized_input(vcfg, picture(20, 30, seed=1))
    eng = ImageEngine(model)
    prompt = _prompt([image], 8, seed=1)
    assert eng.submit("none", prompt, []).reason == "bad_request"
    assert eng.submit("two", prompt, [image, image]).reason == "bad_request"
    short = [t for i, t in enumerate(prompt) if not (t == PAD and i == prompt.index(PAD))]
    assert "placeholder" in eng.submit("short", short, [image]).message
    assert eng.submit("ok", prompt, [image]) is None


def test_two_image_requests_batched_with_decodes(vlm):
    """Both prompts in one engine: their chunks share rounds, and one decodes while the other prefills."""
    ckpt, model = vlm
    vcfg = _resize_config(model)
    eng = ImageEngine(model, budget=13)
    want = {}
    for name, seed in (("one", 1), ("three", 3)):
        pictures, images, prompt = _image_prompt(vcfg, SETS[name], seed=seed)
        want[name] = _reference(ckpt, vcfg, prompt, pictures)[0]
        assert eng.submit(name, prompt, images) is None
    eng.run()
    assert eng.tokens == want
    assert eng.mixed_rounds > 0


@pytest.mark.parametrize("where", ["inside", "after"])
def test_resume_from_a_checkpoint_inside_or_after_an_image(vlm, where):
    """A checkpoint marked inside the image is captured where the image starts (a prefix never ends
    inside an image), one marked after it where marked; either resumes a second request, whose
    positions come from the layout, not from running state, and the image is not encoded again (the
    resume past it needs no embedding; the one before it takes it from the encoder cache)."""
    ckpt, model = vlm
    vcfg = _resize_config(model)
    pictures, images, prompt = _image_prompt(vcfg, [(17, 64)], seed=4, first_picture_seed=1)
    (start, n), = pad_runs(prompt, PAD)
    mark = start + n // 2 if where == "inside" else start + n + 2
    want_tokens, want_logits, _ = _reference(ckpt, vcfg, prompt, pictures)
    eng = ImageEngine(model, reuse=True)
    assert eng.submit("first", prompt, images, opener_start=mark) is None
    eng.run()
    assert eng.submit("again", prompt, images, opener_start=mark) is None
    eng.run()
    assert eng.finished["again"].cached_tokens == (start if where == "inside" else mark)
    assert eng.tokens["first"] == eng.tokens["again"] == want_tokens
    assert _rel(eng.first_logits["again"], want_logits) < TOL
    assert eng.runner.images.encoded == 1
