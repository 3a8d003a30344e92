"""/v1/completions with several prompts: OpenAI's choice numbering, each choice as a request of its prompt alone."""

from __future__ import annotations

import json

from tests.gateway.conftest import http

PROMPTS = ["The sea was calm that", "Numbers: one, two,", "def main():"]


def one(client, server, prompt, **kw):
    return client.completions.create(model=server.model, prompt=prompt, temperature=0, max_tokens=6, **kw)


def test_each_prompts_choices_equal_its_own_request(client, server, demo_tokenizer):
    ids = demo_tokenizer.encode("A list of tokens")
    prompts = [PROMPTS[0], ids, PROMPTS[1]]
    r = client.completions.create(model=server.model, prompt=prompts, temperature=0, max_tokens=6, n=2,
                                  extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == list(range(6))
    alone = [one(client, server, p, extra_body={"return_token_ids": True}) for p in prompts]
    for k, single in enumerate(alone):
        for j in range(2):
            choice = r.choices[k * 2 + j]
            assert choice.text == single.choices[0].text
            assert choice.model_extra["token_ids"] == single.choices[0].model_extra["token_ids"]
    assert r.model_extra["prompt_token_ids"] == [a.model_extra["prompt_token_ids"] for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)


def test_several_prompts_stream_and_echo(client, server):
    singles = [one(client, server, p) for p in PROMPTS]
    alone = [s.choices[0].text for s in singles]
    texts = {}
    finished = set()
    usage = None
    for chunk in client.completions.create(model=server.model, prompt=PROMPTS, temperature=0, max_tokens=6,
                                           stream=True, echo=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finished.add(c.index)
        usage = chunk.usage or usage
    assert finished == {0, 1, 2}
    assert [texts[i] for i in range(3)] == [p + a for p, a in zip(PROMPTS, alone)]
    assert usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)


def test_a_seeded_sampled_batch_repeats_each_prompts_own_draws(client, server):
    kw = dict(temperature=1.0, seed=42, max_tokens=5)
    batch = client.completions.create(model=server.model, prompt=PROMPTS[:2], n=2, **kw)
    for k, prompt in enumerate(PROMPTS[:2]):
        single = client.completions.create(model=server.model, prompt=prompt, n=2, **kw)
        assert [c.text for c in batch.choices[2 * k:2 * k + 2]] == [c.text for c in single.choices]


def test_one_prompt_past_the_context_refuses_the_request(server):
    body = {"prompt": ["short", "word " * 20000], "max_tokens": 2}
    r = http("POST", server.url + "/v1/completions", json.dumps(body).encode(),
             {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
    assert r.status == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_batch_as_lm_eval_sends_it(client, server):
    """lm-eval's loglikelihood requests: 40 prompts at once (its batch_size), echo and logprobs 1, max_tokens 1."""
    prompts = [f"Question {i}: is {i} even? Answer:" for i in range(40)]
    r = client.completions.create(model=server.model, prompt=prompts, temperature=0, max_tokens=1, echo=True,
                                  logprobs=1)
    assert [c.index for c in r.choices] == list(range(40))
    for p, c in zip(prompts, r.choices):
        assert c.text.startswith(p) and c.logprobs.token_logprobs[0] is None
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.text_offset)


def test_many_choices_as_pass_at_k_asks(client, server):
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Write a function"}],
                                       n=20, max_tokens=2, seed=3)
    assert [c.index for c in r.choices] == list(range(20)) and r.usage.completion_tokens <= 40
