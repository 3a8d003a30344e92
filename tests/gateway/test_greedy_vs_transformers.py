"""Served greedy tokens equal transformers' greedy generation for the same rendered prompt.

The demo checkpoint is loaded with ``AutoModelForCausalLM`` in fp32 and
``generate(do_sample=False)`` runs on the prompt ids the server reports
(``return_token_ids``); the server runs with ``ignore_eos`` and the reference is
compared up to its first end-of-sequence token (the demo's eos ids are 2 and 0).
The demo's embedding table is wider than its tokenizer (ids past the
vocabulary are padding); the engine never samples those, so the reference
suppresses them too.
"""

from __future__ import annotations

import pytest

N = 20
EOS = (2, 0)


@pytest.fixture(scope="module")
def hf_model(demo_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo_dir), dtype=torch.float32)
    return model.eval()


def reference(model, prompt_ids, vocab_size, n=N):
    import torch

    padding = list(range(vocab_size, model.config.vocab_size))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n, eos_token_id=None,
                             pad_token_id=0, suppress_tokens=padding or None)
    tokens = out[0, len(prompt_ids):].tolist()
    for i, t in enumerate(tokens):
        if t in EOS:
            return tokens[:i + 1]
    return tokens


def upto_eos(tokens):
    for i, t in enumerate(tokens):
        if t in EOS:
            return tokens[:i + 1]
    return tokens


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And grass?"}],
])
def test_chat_greedy_matches_transformers(client, server, hf_model, demo_tokenizer, messages):
    r = client.chat.completions.create(model=server.model, messages=messages, temperature=0, max_tokens=N,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    prompt_ids = r.model_extra["prompt_token_ids"]
    served = r.choices[0].model_extra["token_ids"]
    assert len(served) == N
    assert upto_eos(served) == reference(hf_model, prompt_ids, demo_tokenizer.vocab_size)


def test_completion_greedy_matches_transformers(client, server, hf_model, demo_tokenizer):
    ids = demo_tokenizer.encode("In the beginning there was a small village by the sea")
    r = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=N,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert upto_eos(r.choices[0].model_extra["token_ids"]) == reference(hf_model, ids, demo_tokenizer.vocab_size)
