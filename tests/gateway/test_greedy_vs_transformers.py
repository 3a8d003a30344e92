"""Served greedy tokens equal transformers' greedy generation for the same rendered prompt.

The demo checkpoint is loaded with ``AutoModelForCausalLM`` in fp32 and
``generate(do_sample=False)`` runs on the prompt ids the server reports
(``return_token_ids``); the server runs with ``ignore_eos`` and the reference is
compared up to its first end-of-sequence token (the demo's generation config
names two), and up to a step where the reference's two best logits tie within
1e-4 (the two forwards sum in other orders: either pick is right there).
``logit_bias`` and ``min_tokens`` are checked against transformers'
``sequence_bias`` and ``min_new_tokens`` on the same prompt, with the server
stopping at end-of-sequence as it does by default; ``allowed_token_ids`` and
``bad_words`` against its greedy pick at every step with the ids they exclude
left out.
The demo's embedding table is wider than its tokenizer (ids past the
vocabulary are padding); the engine never samples those, so the reference
suppresses them too.
"""

from __future__ import annotations

import json

import openai
import pytest

from ignis.gateway.bad_words import bad_word_ids
from ignis.gateway.fields import Fields
from ignis.shared.demo import ensure_demo_model

N = 20
EOS = tuple(json.loads((ensure_demo_model() / "generation_config.json").read_text())["eos_token_id"])


@pytest.fixture(scope="module")
def hf_model(demo_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo_dir), dtype=torch.float32)
    return model.eval()


def reference(model, prompt_ids, vocab_size, n=N, **generate):
    import torch

    padding = list(range(vocab_size, model.config.vocab_size))
    generate = {"eos_token_id": None, **generate}
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n, pad_token_id=0,
                             suppress_tokens=padding or None, **generate)
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


NEAR_TIE = 1e-4
"""A reference logit gap under which the two forwards (summing in other orders, on other CPUs) may pick either."""


def assert_same_greedy(model, prompt_ids, served, want):
    """``served`` equals transformers' ``want``, or agrees up to a step where the reference's two candidates tie
    within ``NEAR_TIE`` (past it the two continue from different tokens: nothing more to compare)."""
    import torch

    for i, (a, b) in enumerate(zip(served, want)):
        if a != b:
            with torch.no_grad():
                logits = model(torch.tensor([list(prompt_ids) + want[:i]])).logits[0, -1]
            gap = abs(float(logits[a] - logits[b]))
            assert gap < NEAR_TIE, f"step {i}: served {a}, transformers {b} (logit gap {gap})"
            return
    assert served == want


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
    want = reference(hf_model, prompt_ids, demo_tokenizer.vocab_size)
    assert_same_greedy(hf_model, prompt_ids, upto_eos(served), want)


def test_completion_greedy_matches_transformers(client, server, hf_model, demo_tokenizer):
    ids = demo_tokenizer.encode("In the beginning there was a small village by the sea")
    r = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=N,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert_same_greedy(hf_model, ids, upto_eos(r.choices[0].model_extra["token_ids"]),
                       reference(hf_model, ids, demo_tokenizer.vocab_size))


def test_logit_bias_and_min_tokens_match_transformers(client, server, hf_model, demo_tokenizer):
    """A bias pushes EOS to the top: it ends the output at once, unless min_tokens holds it back
    that many tokens; other biases reorder the greedy picks."""
    ids = demo_tokenizer.encode("Once upon a time")
    vocab = demo_tokenizer.vocab_size
    plain = reference(hf_model, ids, vocab)
    bias = {EOS[0]: 100.0, plain[0]: -100.0, plain[1]: 3.0, 1000: 2.5}
    for min_tokens in (0, 6):
        r = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=N,
                                      extra_body={"logit_bias": {str(t): b for t, b in bias.items()},
                                                  "min_tokens": min_tokens, "return_token_ids": True})
        served = r.choices[0].model_extra["token_ids"]
        want = reference(hf_model, ids, vocab, sequence_bias={(t,): b for t, b in bias.items()},
                         min_new_tokens=min_tokens, eos_token_id=list(EOS))
        assert served == want and len(served) == min_tokens + 1 and served[-1] == EOS[0]
        assert r.choices[0].finish_reason == "stop"


def test_allowed_token_ids_match_transformers_over_the_allowed_ids(client, server, hf_model, demo_tokenizer):
    """Greedy output under allowed_token_ids is transformers' greedy pick among those ids at every step
    (its forward over the prompt and the output so far)."""
    import torch

    ids = demo_tokenizer.encode("Once upon a time")
    plain = reference(hf_model, ids, demo_tokenizer.vocab_size)
    allowed = sorted({plain[1], plain[2], 1000, 2000, 3000} - {plain[0]})
    r = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=8,
                                  extra_body={"allowed_token_ids": allowed, "return_token_ids": True})
    served = r.choices[0].model_extra["token_ids"]
    assert len(served) == 8 and set(served) <= set(allowed)
    seq = list(ids)
    with torch.no_grad():
        for token in served:
            logits = hf_model(torch.tensor([seq])).logits[0, -1]
            assert token == allowed[int(logits[allowed].argmax())]
            seq.append(token)
    for bad in ([], [-1], [demo_tokenizer.vocab_size], "1,2"):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=server.model, prompt=ids, max_tokens=2,
                                      extra_body={"allowed_token_ids": bad})
        assert e.value.body["param"] == "allowed_token_ids"


def banned_after(sequences, generated) -> set[int]:
    """vLLM's rule: a sequence's last id where the generated tokens end with the ids before it."""
    return {seq[-1] for seq in sequences
            if len(generated) >= len(seq) - 1 and tuple(generated[len(generated) - len(seq) + 1:]) == seq[:-1]}


def word_of_plain_tokens(tokenizer, plain, width):
    """The first ``width`` tokens of the plain output whose text, as a bad word, is tokenized back into them."""
    for at in range(len(plain) - width + 1):
        word = tokenizer.decode(plain[at:at + width])
        window = tuple(plain[at:at + width])
        if word.strip() and window in bad_word_ids(Fields({}), (word,), tokenizer):
            return word, window
    pytest.fail(f"no {width} plain tokens make a word that tokenizes back into them: {plain}")


def test_bad_words_match_transformers_with_their_tokens_banned(client, server, hf_model, demo_tokenizer):
    """Words made of one and of two tokens the plain greedy output generates: the output under bad_words
    follows the plain one until a word's last token would come, takes another token there, and at every
    step is transformers' greedy pick with the ids the words ban after the output so far left out (a
    one-token word's id at every step; a longer word's last id after its others)."""
    import torch

    ids = demo_tokenizer.encode("Once upon a time")
    vocab = demo_tokenizer.vocab_size

    def served(**extra):
        r = client.completions.create(model=server.model, prompt=ids, temperature=0, max_tokens=10,
                                      extra_body={"ignore_eos": True, "return_token_ids": True, **extra})
        return r.choices[0].model_extra["token_ids"]

    plain = served()
    one, one_ids = word_of_plain_tokens(demo_tokenizer, plain, 1)
    two, two_ids = word_of_plain_tokens(demo_tokenizer, plain, 2)
    for words in ([one], [two], [one, two]):
        sequences = bad_word_ids(Fields({}), tuple(words), demo_tokenizer)
        out = served(bad_words=words)
        first = next(i for i in range(len(plain)) if plain[i] in banned_after(sequences, plain[:i]))
        assert out[:first] == plain[:first] and out[first] != plain[first], words
        if one in words:
            assert one_ids[0] not in out
        if two in words:
            assert all(tuple(out[i:i + 2]) != two_ids for i in range(len(out) - 1))
        seq = list(ids)
        with torch.no_grad():
            for i, token in enumerate(out):
                logits = hf_model(torch.tensor([seq])).logits[0, -1]
                logits[vocab:] = float("-inf")
                logits[sorted(banned_after(sequences, out[:i]))] = float("-inf")
                assert token == int(logits.argmax()), (words, i)
                seq.append(token)
    for bad in ("hello", [1], [""], ["7" * 65]):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=server.model, prompt=ids, max_tokens=2, extra_body={"bad_words": bad})
        assert e.value.body["param"] == "bad_words"
