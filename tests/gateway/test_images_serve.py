"""Images through ``ignis serve`` on a tiny random Qwen3.5 VLM (real tokenizer, official template).

Greedy tokens equal transformers' ``generate`` (``Qwen3_5ForConditionalGeneration``
with its own image processor) on the prompt the server reports, with 1 and 3
pictures of different sizes sent as data: URLs through the openai client. A
3-turn conversation with a picture in turn 1 resumes past the picture in
turns 2 and 3, and their outputs equal a cold run's; the same conversation
with another picture of the same size misses from the picture on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from openai import OpenAI
from PIL import Image

from tests.engine.checkpoints import TINY_VLM_ROPE
from tests.engine.models.vision_reference import picture
from tests.gateway.conftest import start_serve, stop_serve
from tests.gateway.image_samples import data_url, encoded, image_part
from tests.support.image_prompts import hf_greedy, pad_runs
from tests.support.real_tokenizer import token_ids

N = 6
PAD = token_ids("qwen3_5")["<|image_pad|>"]
PIXELS = {"shortest_edge": 8 * 8, "longest_edge": 40 * 40}  # tens of image tokens: fast on the CPU


@pytest.fixture(scope="module")
def served(real_checkpoint, tmp_path_factory):
    ckpt = real_checkpoint("qwen3_5", multimodal=True, config_overrides=TINY_VLM_ROPE)
    (ckpt.path / "preprocessor_config.json").write_text(json.dumps({"size": PIXELS}))
    s = start_serve(tmp_path_factory.mktemp("serve-vlm"),
                    ["--model", str(ckpt.path), "--kv-pool-tokens", "8192", "--decode-lanes", "4"])
    client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield s, client, ckpt
    client.close()
    assert stop_serve(s) == 0, s.log()


def _reference(ckpt, prompt_ids: list[int], pictures: list[np.ndarray]) -> list[int]:
    """transformers' greedy tokens for the served prompt, its processor preprocessing the pictures."""
    from ignis.engine.models.vision_config import load_vision_config

    out, _ = hf_greedy(ckpt.model, load_vision_config(ckpt.path), prompt_ids, pictures, PAD, N,
                       eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def _ask(s, client, messages):
    r = client.chat.completions.create(model=s.model, messages=messages, temperature=0, max_tokens=N,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    return r, r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize("sizes", [[(20, 30)], [(50, 41), (17, 64), (30, 30)]], ids=["one", "three"])
def test_greedy_equals_transformers(served, sizes):
    s, client, ckpt = served
    pictures = [picture(h, w, seed=i + 10 * len(sizes)) for i, (h, w) in enumerate(sizes)]
    content = [{"type": "text", "text": "Describe these."}]
    content += [image_part(data_url(encoded(Image.fromarray(p)))) for p in pictures]
    _, prompt_ids, served_ids = _ask(s, client, [{"role": "user", "content": content}])
    assert sum(1 for t in prompt_ids if t == PAD) > len(pictures)  # expanded
    assert served_ids == _reference(ckpt, prompt_ids, pictures)


def _conversation(s, client, pixels: np.ndarray, turns: int):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look at this picture."},
                                             image_part(data_url(encoded(Image.fromarray(pixels))))]}]
    out = []
    for turn in range(turns):
        r, prompt_ids, ids = _ask(s, client, messages)
        out.append((r.usage.prompt_tokens_details.cached_tokens, prompt_ids, ids))
        messages += [{"role": "assistant", "content": r.choices[0].message.content or "ok"},
                     {"role": "user", "content": f"And now question {turn + 2}?"}]
    return out


def test_a_conversation_resumes_past_its_picture_and_another_picture_misses(served):
    s, client, ckpt = served
    cat = picture(24, 40, seed=5)
    turns = _conversation(s, client, cat, 3)
    (start, n), = pad_runs(turns[0][1], PAD)
    end = start + n
    assert turns[0][0] == 0
    for cached, prompt_ids, ids in turns[1:]:
        assert cached > end, (cached, end)
        assert ids == _reference(ckpt, prompt_ids, [cat])  # resumed outputs equal cold ones
    dog = picture(24, 40, seed=6)  # the same size: the same tokens, another picture
    swapped = _conversation(s, client, dog, 2)
    assert swapped[0][1] == turns[0][1]
    assert swapped[0][0] <= start and swapped[1][0] > end  # missed from the picture on; its own turn 2 resumes
    assert swapped[1][2] == _reference(ckpt, swapped[1][1], [dog])
